#include "plan/pipeline_theory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace lattice::plan {
namespace {

TEST(PipelineTheory, BubbleRatiosAreTheSchedulesTheory) {
  EXPECT_DOUBLE_EQ(bubble_ratio(Schedule::kOneFOneB, 8, 32, 1), 7.0 / 32);
  EXPECT_DOUBLE_EQ(bubble_ratio(Schedule::kGpipe, 8, 32, 1), 7.0 / 32);
  EXPECT_DOUBLE_EQ(bubble_ratio(Schedule::kInterleaved1F1B, 8, 32, 4), 7.0 / 128);
  EXPECT_DOUBLE_EQ(bubble_ratio(Schedule::kZeroBubbleH1, 8, 32, 1), 7.0 / 96);
  EXPECT_DOUBLE_EQ(bubble_ratio(Schedule::kOneFOneB, 1, 32, 1), 0.0);
  EXPECT_DOUBLE_EQ(bubble_share_of_step(Schedule::kOneFOneB, 4, 12, 1), 3.0 / 15);
}

// An event simulation of 1F1B and GPipe with forward 1 and backward 2 time units: each stage
// runs its instruction list in order, each instruction waits for its neighbour's result.
struct Simulated {
  double bubble_ratio;
  std::vector<int64_t> peak_in_flight;  // per stage
};

Simulated simulate(Schedule schedule, int64_t p, int64_t m) {
  struct Op {
    bool forward;
    int64_t micro_batch;
  };
  std::vector<std::vector<Op>> program(p);
  for (int64_t s = 0; s < p; ++s) {
    if (schedule == Schedule::kGpipe) {
      for (int64_t i = 0; i < m; ++i) program[s].push_back({true, i});
      for (int64_t i = 0; i < m; ++i) program[s].push_back({false, i});
      continue;
    }
    const int64_t warmup = std::min(m, p - s - 1);
    int64_t f = 0, b = 0;
    for (; f < warmup; ++f) program[s].push_back({true, f});
    while (f < m) {
      program[s].push_back({true, f++});
      program[s].push_back({false, b++});
    }
    while (b < m) program[s].push_back({false, b++});
  }
  const double kForward = 1, kBackward = 2;
  std::vector<std::vector<double>> forward_done(p, std::vector<double>(m, -1));
  std::vector<std::vector<double>> backward_done(p, std::vector<double>(m, -1));
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0);
  std::vector<int64_t> in_flight(p, 0), peak(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t s = 0; s < p; ++s) {
      while (next[s] < program[s].size()) {
        const Op op = program[s][next[s]];
        double ready;
        if (op.forward) {
          ready = s == 0 ? 0 : forward_done[s - 1][op.micro_batch];
        } else {
          ready =
              s == p - 1 ? forward_done[s][op.micro_batch] : backward_done[s + 1][op.micro_batch];
        }
        if (ready < 0) break;  // its input is not computed yet
        clock[s] = std::max(clock[s], ready) + (op.forward ? kForward : kBackward);
        (op.forward ? forward_done : backward_done)[s][op.micro_batch] = clock[s];
        in_flight[s] += op.forward ? 1 : -1;
        peak[s] = std::max(peak[s], in_flight[s]);
        ++next[s];
        progress = true;
      }
    }
  }
  const double end = *std::max_element(clock.begin(), clock.end());
  const double ideal = double(m) * (kForward + kBackward);
  return {(end - ideal) / ideal, peak};
}

TEST(PipelineTheory, BubbleAndInFlightMatchASimulatedSchedule) {
  for (Schedule schedule : {Schedule::kOneFOneB, Schedule::kGpipe}) {
    for (auto [p, m] : {std::pair<int64_t, int64_t>{2, 4}, {4, 4}, {4, 16}, {8, 3}, {6, 24}}) {
      Simulated sim = simulate(schedule, p, m);
      EXPECT_NEAR(sim.bubble_ratio, bubble_ratio(schedule, p, m, 1), 1e-12)
          << schedule_kind_name(schedule) << " p=" << p << " m=" << m;
      for (int64_t s = 0; s < p; ++s) {
        EXPECT_EQ(sim.peak_in_flight[s], chunks_in_flight(schedule, p, m, 1, s))
            << schedule_kind_name(schedule) << " p=" << p << " m=" << m << " stage " << s;
      }
    }
  }
}

TEST(PipelineTheory, InterleavedFirstStageHoldsKorthikantisFactor) {
  // l·(1 + (p−1)/(p·v)) layers' worth on stage 0, in chunks of l/(p·v) layers.
  const int64_t p = 8, v = 3, l = 96, m = 64;
  const double layers =
      double(chunks_in_flight(Schedule::kInterleaved1F1B, p, m, v, 0)) * double(l) / double(p * v);
  EXPECT_DOUBLE_EQ(layers, double(l) * (1.0 + double(p - 1) / double(p * v)));
  // Fewer micro-batches than the warm-up cap everything at m·v chunks.
  EXPECT_EQ(chunks_in_flight(Schedule::kInterleaved1F1B, 8, 2, 3, 0), 6);
  // The last stage holds the fewest.
  EXPECT_EQ(chunks_in_flight(Schedule::kInterleaved1F1B, p, m, v, p - 1), (v - 1) * p + 1);
}

}  // namespace
}  // namespace lattice::plan
