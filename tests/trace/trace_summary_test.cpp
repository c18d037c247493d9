#include "trace/trace_summary.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace lattice {
namespace {

using C = TraceCategory;

// One step on [0, 100) ns:
//   compute    [0, 30) with a nested compute [5, 10)
//   collective [20, 50), 3000 bytes            (10 ns of it under compute)
//   gap        [50, 60)
//   idle       [60, 70)
//   recv       [70, 90), 800 bytes, with a wait recorded as idle at [75, 85)
//   gap        [90, 100)
std::vector<TraceEvent> one_step() {
  return {
      {"matmul", C::kCompute, 5, 10, {}},
      {"forward", C::kCompute, 0, 30, {}},
      {"all_reduce", C::kCollective, 20, 50, {{"bytes", 3000}, {"group", "dp"}}},
      {"bubble", C::kIdle, 60, 70, {}},
      {"wait", C::kIdle, 75, 85, {}},
      {"recv activations", C::kRecv, 70, 90, {{"bytes", 800}}},
      {"step", C::kStep, 0, 100, {{"step", 0}}},
  };
}

TEST(TraceSummaryTest, BusyIdleAndBubbleOfOneStep) {
  RankTraceSummary s = summarize_rank_trace(4, one_step(), TraceWindow{0, 100});
  EXPECT_EQ(s.rank, 4);
  EXPECT_EQ(s.busy(C::kCompute), 30);  // the nested matmul counts once
  EXPECT_EQ(s.busy(C::kCollective), 30);
  EXPECT_EQ(s.busy(C::kRecv), 20);
  EXPECT_EQ(s.busy(C::kIdle), 20);  // the explicit idle events
  EXPECT_EQ(s.busy(C::kSend), 0);
  EXPECT_EQ(s.busy(C::kStep), 100);
  // Work covers [0, 50) and [70, 90) = 70 ns, less the 10 ns wait inside the recv.
  EXPECT_EQ(s.active_ns, 60);
  // Idle: the gaps [50, 60) and [90, 100), the bubble [60, 70) and the wait [75, 85).
  EXPECT_EQ(s.idle_ns, 40);
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 0.4);
  EXPECT_DOUBLE_EQ(s.idle_per_active(), 40.0 / 60.0);
  EXPECT_EQ(s.collective_hidden_ns, 10);
  EXPECT_DOUBLE_EQ(s.collective_hidden_fraction(), 1.0 / 3.0);

  ASSERT_EQ(s.bandwidth.size(), 2u);  // sorted by category: recv before collective
  EXPECT_EQ(s.bandwidth[0].category, C::kRecv);
  EXPECT_EQ(s.bandwidth[0].name, "recv activations");
  EXPECT_EQ(s.bandwidth[0].bytes, 800);
  EXPECT_DOUBLE_EQ(s.bandwidth[0].bytes_per_second(), 800 / 20e-9);
  EXPECT_EQ(s.bandwidth[1].name, "all_reduce");
  EXPECT_EQ(s.bandwidth[1].calls, 1);
  EXPECT_EQ(s.bandwidth[1].duration_ns, 30);
  EXPECT_DOUBLE_EQ(s.bandwidth[1].bytes_per_second(), 1e11);  // 3000 B / 30 ns
}

TEST(TraceSummaryTest, DefaultWindowRunsFromFirstStartToLastEnd) {
  std::vector<TraceEvent> events = {
      {"forward", C::kCompute, 1000, 1400, {}},
      {"backward", C::kCompute, 1500, 2000, {}},
  };
  RankTraceSummary s = summarize_rank_trace(0, events);
  EXPECT_EQ(s.window, (TraceWindow{1000, 2000}));
  EXPECT_EQ(s.busy(C::kCompute), 900);
  EXPECT_EQ(s.idle_ns, 100);
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 0.1);

  RankTraceSummary empty = summarize_rank_trace(0, std::vector<TraceEvent>{});
  EXPECT_EQ(empty.window.length_ns(), 0);
  EXPECT_EQ(empty.idle_ns, 0);
  EXPECT_EQ(empty.bubble_fraction, 0);
}

TEST(TraceSummaryTest, EventsAreClippedToTheWindow) {
  RankTraceSummary s = summarize_rank_trace(0, one_step(), TraceWindow{10, 60});
  EXPECT_EQ(s.busy(C::kCompute), 20);     // [10, 30)
  EXPECT_EQ(s.busy(C::kCollective), 30);  // [20, 50)
  EXPECT_EQ(s.busy(C::kRecv), 0);
  EXPECT_EQ(s.active_ns, 40);  // [10, 50)
  EXPECT_EQ(s.idle_ns, 10);    // [50, 60)
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 0.2);
  // Bandwidth counts the transfers that start in the window: the all_reduce, not the recv.
  ASSERT_EQ(s.bandwidth.size(), 1u);
  EXPECT_EQ(s.bandwidth[0].name, "all_reduce");

  EXPECT_THROW(summarize_rank_trace(0, one_step(), TraceWindow{60, 10}), ContractError);
}

TEST(TraceSummaryTest, BandwidthSumsCallsOfOneNameAndSkipsEventsWithoutBytes) {
  std::vector<TraceEvent> events = {
      {"all_reduce", C::kCollective, 0, 10, {{"bytes", 1000}}},
      {"all_reduce", C::kCollective, 10, 40, {{"bytes", 2000}}},
      {"all_gather", C::kCollective, 40, 50, {}},                   // no bytes: no row
      {"all_gather", C::kCollective, 50, 60, {{"bytes", "many"}}},  // not an integer: no row
      {"embedding", C::kCompute, 60, 70, {{"bytes", 5}}},           // not a transfer
      {"send grads", C::kSend, 70, 80, {{"bytes", 400}}},
  };
  RankTraceSummary s = summarize_rank_trace(0, events);
  ASSERT_EQ(s.bandwidth.size(), 2u);
  EXPECT_EQ(s.bandwidth[0].category, C::kSend);
  EXPECT_EQ(s.bandwidth[0].bytes, 400);
  EXPECT_EQ(s.bandwidth[1].name, "all_reduce");
  EXPECT_EQ(s.bandwidth[1].calls, 2);
  EXPECT_EQ(s.bandwidth[1].bytes, 3000);
  EXPECT_EQ(s.bandwidth[1].duration_ns, 40);
  EXPECT_DOUBLE_EQ(s.bandwidth[1].bytes_per_second(), 75e9);  // 3000 B / 40 ns
}

// The events of stage `stage` in a GPipe step: all m forwards (tf each) then all m backwards
// (tb each), every stage waiting for its predecessor; the step window is the same on all
// stages. Theory: bubble (p-1)(tf+tb) against ideal m(tf+tb).
std::vector<TraceEvent> gpipe_stage(int p, int m, int stage, int64_t tf, int64_t tb) {
  std::vector<TraceEvent> events;
  int64_t forwards_end = int64_t(m + p - 1) * tf;
  int64_t step_end = forwards_end + int64_t(m + p - 1) * tb;
  events.push_back({"step", C::kStep, 0, step_end, {}});
  for (int mb = 0; mb < m; ++mb) {
    int64_t start = int64_t(stage + mb) * tf;
    events.push_back({"forward", C::kCompute, start, start + tf, {{"micro_batch", mb}}});
  }
  for (int mb = 0; mb < m; ++mb) {
    int64_t start = forwards_end + int64_t(p - 1 - stage + mb) * tb;
    events.push_back({"backward", C::kCompute, start, start + tb, {{"micro_batch", mb}}});
  }
  return events;
}

TEST(TraceSummaryTest, GPipeBubbleMatchesTheTheoryOnEveryStage) {
  constexpr int kStages = 4;
  for (int m : {4, 8, 16}) {
    for (int stage = 0; stage < kStages; ++stage) {
      SCOPED_TRACE(::testing::Message() << "m=" << m << " stage=" << stage);
      std::vector<TraceEvent> events = gpipe_stage(kStages, m, stage, 100, 200);
      std::vector<RankTraceSummary> steps = summarize_rank_steps(stage, events);
      ASSERT_EQ(steps.size(), 1u);
      EXPECT_EQ(steps[0].idle_ns, (kStages - 1) * 300);
      EXPECT_EQ(steps[0].busy(C::kCompute), m * 300);
      EXPECT_DOUBLE_EQ(steps[0].bubble_fraction, double(kStages - 1) / (m + kStages - 1));
      EXPECT_DOUBLE_EQ(steps[0].idle_per_active(), double(kStages - 1) / m);
    }
  }
}

TEST(TraceSummaryTest, StepsAreSummarisedInOrderOfTheirStart) {
  std::vector<TraceEvent> events = {
      {"step", C::kStep, 100, 200, {}},
      {"forward", C::kCompute, 100, 150, {}},
      {"step", C::kStep, 0, 100, {}},
      {"forward", C::kCompute, 0, 75, {}},
  };
  EXPECT_EQ(step_windows(events), (std::vector<TraceWindow>{{0, 100}, {100, 200}}));
  std::vector<RankTraceSummary> steps = summarize_rank_steps(0, events);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_DOUBLE_EQ(steps[0].bubble_fraction, 0.25);
  EXPECT_DOUBLE_EQ(steps[1].bubble_fraction, 0.5);
}

TEST(TraceSummaryTest, MergeSortsRanksAndAggregatesBubblesAndBandwidth) {
  std::vector<RankTraceSummary> ranks;
  // Rank 2 idles 40 %, rank 0 idles 10 %, rank 1 25 %; all run one all_reduce.
  ranks.push_back(summarize_rank_trace(2, one_step(), TraceWindow{0, 100}));
  ranks.push_back(summarize_rank_trace(
      0,
      std::vector<TraceEvent>{{"forward", C::kCompute, 0, 80, {}},
                              {"all_reduce", C::kCollective, 80, 90, {{"bytes", 1000}}},
                              {"late", C::kCompute, 100, 111, {}}},  // after the window
      TraceWindow{0, 100}));
  ranks.push_back(summarize_rank_trace(
      1, std::vector<TraceEvent>{{"all_reduce", C::kCollective, 0, 75, {{"bytes", 5000}}}},
      TraceWindow{0, 100}));

  TraceSummary merged = merge_trace_summaries(std::move(ranks));
  ASSERT_EQ(merged.ranks.size(), 3u);
  EXPECT_EQ(merged.ranks[0].rank, 0);
  EXPECT_EQ(merged.ranks[1].rank, 1);
  EXPECT_EQ(merged.ranks[2].rank, 2);
  EXPECT_DOUBLE_EQ(merged.ranks[0].bubble_fraction, 0.1);
  EXPECT_DOUBLE_EQ(merged.ranks[1].bubble_fraction, 0.25);
  EXPECT_DOUBLE_EQ(merged.max_bubble_fraction, 0.4);
  EXPECT_DOUBLE_EQ(merged.mean_bubble_fraction, (0.1 + 0.25 + 0.4) / 3);
  ASSERT_EQ(merged.bandwidth.size(), 2u);  // recv activations, all_reduce
  const TransferBandwidth& all_reduce = merged.bandwidth[1];
  EXPECT_EQ(all_reduce.name, "all_reduce");
  EXPECT_EQ(all_reduce.calls, 3);
  EXPECT_EQ(all_reduce.bytes, 3000 + 1000 + 5000);
  EXPECT_EQ(all_reduce.duration_ns, 30 + 10 + 75);

  std::string table = merged.table();
  EXPECT_NE(table.find("bubble fraction: mean 25.00 %, max 40.00 %"), std::string::npos) << table;
  EXPECT_NE(table.find("all_reduce"), std::string::npos) << table;
  // Rank 2's row: window 0.0001 ms, compute 0.00003 ms ... and its 40 % bubble at the end.
  EXPECT_NE(table.find("40.00\n"), std::string::npos) << table;
}

TEST(TraceSummaryTest, MergingTwoSummariesOfOneRankIsRefused) {
  std::vector<RankTraceSummary> ranks = {summarize_rank_trace(3, one_step()),
                                         summarize_rank_trace(3, one_step())};
  EXPECT_THROW(merge_trace_summaries(std::move(ranks)), ContractError);
}

}  // namespace
}  // namespace lattice
