#include "trace/trace_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "core/error.h"

namespace lattice {

namespace {

// [start, end) intervals, sorted and disjoint after clipped_union.
using Interval = std::pair<int64_t, int64_t>;

bool is_work(TraceCategory category) {
  return category != TraceCategory::kIdle && category != TraceCategory::kStep;
}

bool is_transfer(TraceCategory category) {
  return category == TraceCategory::kCollective || category == TraceCategory::kSend ||
         category == TraceCategory::kRecv;
}

// The union of the selected events' intervals, clipped to the window.
template <typename Select>
std::vector<Interval> clipped_union(std::span<const TraceEvent> events, TraceWindow window,
                                    Select select) {
  std::vector<Interval> intervals;
  for (const TraceEvent& event : events) {
    if (!select(event.category)) continue;
    int64_t start = std::max(event.start_ns, window.start_ns);
    int64_t end = std::min(event.end_ns, window.end_ns);
    if (start < end) intervals.emplace_back(start, end);
  }
  std::sort(intervals.begin(), intervals.end());
  std::vector<Interval> merged;
  for (const Interval& interval : intervals) {
    if (!merged.empty() && interval.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, interval.second);
    } else {
      merged.push_back(interval);
    }
  }
  return merged;
}

int64_t total_length(const std::vector<Interval>& intervals) {
  int64_t total = 0;
  for (const auto& [start, end] : intervals) total += end - start;
  return total;
}

// The length of the intersection of two sorted disjoint interval lists.
int64_t intersection_length(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  int64_t total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    int64_t start = std::max(a[i].first, b[j].first);
    int64_t end = std::min(a[i].second, b[j].second);
    if (start < end) total += end - start;
    // Drop whichever ends first: it cannot meet anything further along the other list.
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return total;
}

using TransferKey = std::pair<TraceCategory, std::string>;

void add_transfer(std::map<TransferKey, TransferBandwidth>& rows, const TransferBandwidth& row) {
  TransferBandwidth& total = rows[{row.category, row.name}];
  total.category = row.category;
  total.name = row.name;
  total.calls += row.calls;
  total.bytes += row.bytes;
  total.duration_ns += row.duration_ns;
}

std::vector<TransferBandwidth> transfer_rows(std::map<TransferKey, TransferBandwidth> rows) {
  std::vector<TransferBandwidth> out;
  for (auto& [key, row] : rows) out.push_back(std::move(row));
  return out;
}

double ms(int64_t ns) {
  return double(ns) / 1e6;
}

}  // namespace

std::vector<TraceWindow> step_windows(std::span<const TraceEvent> events) {
  std::vector<TraceWindow> windows;
  for (const TraceEvent& event : events) {
    if (event.category == TraceCategory::kStep) windows.push_back({event.start_ns, event.end_ns});
  }
  std::sort(windows.begin(), windows.end(), [](const TraceWindow& a, const TraceWindow& b) {
    return std::tie(a.start_ns, a.end_ns) < std::tie(b.start_ns, b.end_ns);
  });
  return windows;
}

double RankTraceSummary::collective_hidden_fraction() const {
  int64_t collective = busy(TraceCategory::kCollective);
  return collective > 0 ? double(collective_hidden_ns) / collective : 0;
}

RankTraceSummary summarize_rank_trace(int rank, std::span<const TraceEvent> events) {
  if (events.empty()) return summarize_rank_trace(rank, events, TraceWindow{});
  TraceWindow window{events.front().start_ns, events.front().end_ns};
  for (const TraceEvent& event : events) {
    window.start_ns = std::min(window.start_ns, event.start_ns);
    window.end_ns = std::max(window.end_ns, event.end_ns);
  }
  return summarize_rank_trace(rank, events, window);
}

RankTraceSummary summarize_rank_trace(int rank, std::span<const TraceEvent> events,
                                      TraceWindow window) {
  LATTICE_CHECK_LE(window.start_ns, window.end_ns, "a trace window ends before it starts");
  RankTraceSummary summary;
  summary.rank = rank;
  summary.window = window;
  for (int c = 0; c < kTraceCategoryCount; ++c) {
    auto category = static_cast<TraceCategory>(c);
    summary.busy_ns[c] = total_length(
        clipped_union(events, window, [&](TraceCategory other) { return other == category; }));
  }

  std::vector<Interval> work = clipped_union(events, window, is_work);
  std::vector<Interval> marked_idle =
      clipped_union(events, window, [](TraceCategory c) { return c == TraceCategory::kIdle; });
  summary.active_ns = total_length(work) - intersection_length(work, marked_idle);
  summary.idle_ns = window.length_ns() - summary.active_ns;
  summary.bubble_fraction =
      window.length_ns() > 0 ? double(summary.idle_ns) / window.length_ns() : 0;

  summary.collective_hidden_ns = intersection_length(
      clipped_union(events, window,
                    [](TraceCategory c) { return c == TraceCategory::kCollective; }),
      clipped_union(events, window, [](TraceCategory c) { return c == TraceCategory::kCompute; }));

  std::map<TransferKey, TransferBandwidth> rows;
  for (const TraceEvent& event : events) {
    if (!is_transfer(event.category)) continue;
    if (event.start_ns < window.start_ns || event.start_ns >= window.end_ns) continue;
    std::optional<int64_t> bytes = event.int_arg("bytes");
    if (!bytes) continue;
    add_transfer(rows, {event.category, event.name, 1, *bytes, event.duration_ns()});
  }
  summary.bandwidth = transfer_rows(std::move(rows));
  return summary;
}

std::vector<RankTraceSummary> summarize_rank_steps(int rank, std::span<const TraceEvent> events) {
  std::vector<RankTraceSummary> steps;
  for (const TraceWindow& window : step_windows(events)) {
    steps.push_back(summarize_rank_trace(rank, events, window));
  }
  return steps;
}

TraceSummary merge_trace_summaries(std::vector<RankTraceSummary> ranks) {
  std::sort(ranks.begin(), ranks.end(),
            [](const RankTraceSummary& a, const RankTraceSummary& b) { return a.rank < b.rank; });
  for (size_t i = 1; i < ranks.size(); ++i) {
    LATTICE_CHECK_NE(ranks[i - 1].rank, ranks[i].rank,
                     "merge one summary per rank (summarize each step on its own)");
  }
  TraceSummary merged;
  std::map<TransferKey, TransferBandwidth> rows;
  double bubble_sum = 0;
  for (const RankTraceSummary& rank : ranks) {
    bubble_sum += rank.bubble_fraction;
    merged.max_bubble_fraction = std::max(merged.max_bubble_fraction, rank.bubble_fraction);
    for (const TransferBandwidth& row : rank.bandwidth) add_transfer(rows, row);
  }
  merged.mean_bubble_fraction = ranks.empty() ? 0 : bubble_sum / double(ranks.size());
  merged.bandwidth = transfer_rows(std::move(rows));
  merged.ranks = std::move(ranks);
  return merged;
}

std::string TraceSummary::table() const {
  // The work categories as columns; kIdle and kStep are the idle and window columns.
  constexpr TraceCategory kColumns[] = {TraceCategory::kCompute,   TraceCategory::kSend,
                                        TraceCategory::kRecv,      TraceCategory::kCollective,
                                        TraceCategory::kOptimizer, TraceCategory::kData,
                                        TraceCategory::kCheckpoint};
  std::string out = fmt::format("{:>5} {:>11}", "rank", "window ms");
  for (TraceCategory column : kColumns) out += fmt::format(" {:>11}", trace_category_name(column));
  out += fmt::format(" {:>11} {:>8}\n", "idle", "bubble %");
  for (const RankTraceSummary& rank : ranks) {
    out += fmt::format("{:>5} {:>11.3f}", rank.rank, ms(rank.window.length_ns()));
    for (TraceCategory column : kColumns) out += fmt::format(" {:>11.3f}", ms(rank.busy(column)));
    out += fmt::format(" {:>11.3f} {:>8.2f}\n", ms(rank.idle_ns), 100 * rank.bubble_fraction);
  }
  out += fmt::format("bubble fraction: mean {:.2f} %, max {:.2f} %\n", 100 * mean_bubble_fraction,
                     100 * max_bubble_fraction);
  if (!bandwidth.empty()) {
    out += fmt::format("{:>11} {:<24} {:>7} {:>12} {:>11} {:>9}\n", "category", "name", "calls",
                       "MB", "ms", "GB/s");
    for (const TransferBandwidth& row : bandwidth) {
      out +=
          fmt::format("{:>11} {:<24} {:>7} {:>12.3f} {:>11.3f} {:>9.3f}\n",
                      trace_category_name(row.category), row.name, row.calls,
                      double(row.bytes) / 1e6, ms(row.duration_ns), row.bytes_per_second() / 1e9);
    }
  }
  return out;
}

}  // namespace lattice
