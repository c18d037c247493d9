// What a rank's events say about its time: busy time per category, idle time and the bubble
// fraction within a window (a training step), how much collective time hid behind compute, and
// the bandwidth that collectives and point-to-point transfers achieved. Summaries of all ranks
// merge into one per-rank table.
//
// Definitions (all times clipped to the window; overlapping events of one category count once):
// - work is every event that is not kIdle or kStep (kStep only marks windows);
// - a moment is idle when an explicit kIdle event covers it or no work event does, so a wait
//   recorded as idle inside a recv scope counts as idle, and so does a gap nobody recorded;
// - bubble_fraction = idle_ns / window length. Over a whole pipeline step of a schedule with
//   bubble b and ideal time t this is b / (b + t); idle_per_active() = b / t is the form of
//   Narayanan et al. 2021 ((p-1)/m for gpipe and 1f1b).
// - bandwidth = bytes argument / duration, summed over the calls of one (category, name) whose
//   start lies in the window: algorithm bandwidth, as comm/comm_stats.h reports it.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "trace/trace_event.h"

namespace lattice {

// A half-open span of time [start_ns, end_ns) on the trace clock.
struct TraceWindow {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t length_ns() const { return end_ns - start_ns; }
  bool operator==(const TraceWindow&) const = default;
};

// The windows of the kStep events, in order of their start.
std::vector<TraceWindow> step_windows(std::span<const TraceEvent> events);

// The transfers of one (category, name), e.g. (collective, "all_reduce"), carrying a "bytes"
// argument.
struct TransferBandwidth {
  TraceCategory category = TraceCategory::kCollective;
  std::string name;
  int64_t calls = 0;
  int64_t bytes = 0;
  int64_t duration_ns = 0;  // summed over the calls
  double bytes_per_second() const {
    return duration_ns > 0 ? double(bytes) * 1e9 / duration_ns : 0;
  }
};

struct RankTraceSummary {
  int rank = 0;
  TraceWindow window;
  // Per category (indexed by TraceCategory): the length of the union of its events.
  std::array<int64_t, kTraceCategoryCount> busy_ns{};
  int64_t idle_ns = 0;
  int64_t active_ns = 0;  // window length - idle_ns
  double bubble_fraction = 0;
  // Collective time during which compute also ran (communication hidden behind compute).
  int64_t collective_hidden_ns = 0;
  std::vector<TransferBandwidth> bandwidth;  // sorted by (category, name)

  int64_t busy(TraceCategory category) const { return busy_ns[static_cast<size_t>(category)]; }
  double idle_per_active() const { return active_ns > 0 ? double(idle_ns) / active_ns : 0; }
  // The share of collective time hidden behind compute, 0 when there were no collectives.
  double collective_hidden_fraction() const;
};

// Over [first start, last end) of all the events (an empty window when there are none).
RankTraceSummary summarize_rank_trace(int rank, std::span<const TraceEvent> events);
RankTraceSummary summarize_rank_trace(int rank, std::span<const TraceEvent> events,
                                      TraceWindow window);
// One summary per step window (step_windows), e.g. the bubble fraction per step.
std::vector<RankTraceSummary> summarize_rank_steps(int rank, std::span<const TraceEvent> events);

struct TraceSummary {
  std::vector<RankTraceSummary> ranks;  // sorted by rank
  double mean_bubble_fraction = 0;
  double max_bubble_fraction = 0;
  // Per (category, name), summed over ranks.
  std::vector<TransferBandwidth> bandwidth;

  // A fixed-width text table: one row per rank (window, busy ms per category, idle ms, bubble
  // %), then one row per transfer kind (calls, MB, ms, GB/s).
  std::string table() const;
};

// Merges the summaries of distinct ranks.
TraceSummary merge_trace_summaries(std::vector<RankTraceSummary> ranks);

}  // namespace lattice
