#include "plan/search.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "plan_test_setups.h"

namespace lattice::plan {
namespace {

using testing::setup_for;

TEST(Search, FixingEveryDimensionEvaluatesOneLayout) {
  // The example: --tp 8 --pp 8 --dp 1 --micro-batch 1 --virtual-stages 3
  // --recompute selective --sp (64 devices), but 16 chunks per stage: 128 chunks for 80 layers.
  TrainingSetup s = setup_for("llama-3-70b", "dgx-h100", 64, 64, 4096);
  SearchConstraints c;
  c.tp = 8, c.pp = 8, c.dp = 1, c.micro_batch = 1, c.virtual_stages = 16;
  c.recompute = {Recompute::kSelective};
  c.sequence_parallel = true;
  SearchResult r = search_layouts(s, c);
  EXPECT_EQ(r.evaluated, 1);
  EXPECT_EQ(r.rejected[size_t(RejectReason::kDivisibility)], 1);
  EXPECT_TRUE(r.ranked.empty());

  c.virtual_stages = 5;  // 80 = 8 × 5 × 2
  r = search_layouts(s, c);
  ASSERT_EQ(r.evaluated, 1);
  ASSERT_EQ(r.ranked.size(), 1u);
  const Layout& l = r.ranked.front().layout;
  EXPECT_EQ(l.schedule, Schedule::kInterleaved1F1B);
  EXPECT_EQ(l.virtual_stages, 5);
  EXPECT_TRUE(l.sequence_parallel);
}

TEST(Search, ThousandDeviceSearchStaysSmallAndRanksByThroughput) {
  SearchResult r = search_layouts(testing::llama70b_on_1024_h100(), {});
  // 11 tp × up to 11 pp sizes × micro-batches × schedules × ZeRO × recompute × SP: tens of
  // thousands of layouts, each judged in closed form (the time is in docs/planner.md).
  EXPECT_GT(r.evaluated, 10'000);
  EXPECT_LT(r.evaluated, 100'000);
  int64_t rejected = 0;
  for (int64_t n : r.rejected) rejected += n;
  EXPECT_EQ(r.feasible + rejected, r.evaluated);
  ASSERT_EQ(r.ranked.size(), 5u);
  for (size_t i = 1; i < r.ranked.size(); ++i) {
    EXPECT_GE(r.ranked[i - 1].time.tokens_per_second, r.ranked[i].time.tokens_per_second);
  }
  const Layout& best = r.ranked.front().layout;
  EXPECT_LE(best.tp, 8) << "tensor parallelism should stay inside a node: " << describe(best);
  EXPECT_GT(best.tp * best.pp, 1) << "70B cannot train data-parallel only: " << describe(best);
  EXPECT_TRUE(r.ranked.front().memory.fits());
}

// Mixtral 8x7B on 64 H100s: ep is searched (the divisors of dp that divide 8 experts); the
// best layout spreads the experts, and is at least as fast as the best one fixed to ep 1. A
// dense model is never given an ep.
TEST(Search, ASparseModelSearchesExpertParallelism) {
  TrainingSetup s = setup_for("mixtral-8x7b", "dgx-h100", 64, 512, 4096);
  const SearchResult r = search_layouts(s, {});
  ASSERT_FALSE(r.ranked.empty());
  const Evaluation& best = r.ranked.front();
  EXPECT_GT(best.layout.ep, 1) << describe(best.layout);
  EXPECT_EQ(best.layout.dp % best.layout.ep, 0);
  EXPECT_EQ(s.model.n_experts % best.layout.ep, 0);
  EXPECT_LE(best.layout.zero, 1) << "ZeRO-2/3 with ep are refused";
  SearchConstraints no_ep;
  no_ep.ep = 1;
  const SearchResult fixed = search_layouts(s, no_ep);
  if (!fixed.ranked.empty()) {
    EXPECT_GE(best.time.tokens_per_second, fixed.ranked.front().time.tokens_per_second);
  }
  for (const Evaluation& e : search_layouts(testing::llama70b_on_1024_h100(), {}).ranked) {
    EXPECT_EQ(e.layout.ep, 1) << describe(e.layout);
  }
}

TEST(Search, BestBeatsEveryLayoutOfAHandMadeGrid) {
  TrainingSetup s = setup_for("gpt2-350m", "dgx-a100", 16, 256, 1024);
  SearchResult r = search_layouts(s, {});
  ASSERT_FALSE(r.ranked.empty());
  const double best = r.ranked.front().time.tokens_per_second;
  for (int64_t tp : {1, 2, 4, 8}) {
    for (int64_t pp : {1, 2, 4}) {
      for (int zero : {0, 1, 2, 3}) {
        for (int64_t b : {1, 2, 4, 8}) {
          Layout l{.dp = 16 / (tp * pp), .tp = tp, .pp = pp, .zero = zero, .micro_batch = b};
          Evaluation e = evaluate(s, l);
          if (e.feasible()) {
            EXPECT_LE(e.time.tokens_per_second, best) << describe(l);
          }
        }
      }
    }
  }
}

TEST(Search, SmallModelOnOneNodeStaysDataParallel) {
  SearchResult r = search_layouts(setup_for("gpt2-124m", "dgx-a100", 8, 512, 1024), {});
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_EQ(r.ranked.front().layout.dp, 8) << describe(r.ranked.front().layout);
}

TEST(Search, ConstraintsAreHonoured) {
  SearchConstraints c;
  c.max_pp = 2;
  c.zero_stages = {1};
  c.recompute = {Recompute::kFull};
  SearchResult r = search_layouts(testing::llama70b_on_1024_h100(), c);
  ASSERT_FALSE(r.ranked.empty());
  for (const Evaluation& e : r.ranked) {
    EXPECT_LE(e.layout.pp, 2);
    EXPECT_EQ(e.layout.zero, 1);
    EXPECT_EQ(e.layout.recompute, Recompute::kFull);
  }
}

TEST(Search, NothingFitsReportsTheClosestLayout) {
  SearchConstraints c;
  c.tp = 1, c.pp = 1;
  c.zero_stages = {0};
  SearchResult r = search_layouts(setup_for("llama-3-70b", "dgx-h100", 8, 64, 4096), c);
  EXPECT_TRUE(r.ranked.empty());
  EXPECT_EQ(r.feasible, 0);
  ASSERT_TRUE(r.closest_to_fitting.has_value());
  EXPECT_EQ(r.closest_to_fitting->rejection->reason, RejectReason::kMemory);
}

TEST(Search, ContradictoryConstraintsAreRefused) {
  SearchConstraints c;
  c.tp = 3;
  EXPECT_THROW(search_layouts(setup_for("gpt2-124m", "dgx-a100", 8, 64, 1024), c), ConfigError);
  c = {};
  c.zero_stages.clear();
  EXPECT_THROW(search_layouts(setup_for("gpt2-124m", "dgx-a100", 8, 64, 1024), c), ConfigError);
  EXPECT_THROW(search_layouts(setup_for("gpt2-124m", "dgx-a100", 8, 64, 4096), {}), ConfigError);
}

// --headroom: every layout that fits leaves that share of the device free, and the best one
// without headroom, which sits near the top of the memory, no longer fits.
TEST(Search, AMemoryHeadroomKeepsThatShareOfTheDeviceFree) {
  TrainingSetup s = setup_for("llama-3-70b", "dgx-h100", 64, 512, 4096);
  const SearchResult full = search_layouts(s, {});
  ASSERT_FALSE(full.ranked.empty());
  const double usable = s.cluster.usable_memory_bytes();
  EXPECT_GT(full.ranked.front().memory.total, 0.9 * usable);  // the case worth guarding against
  s.memory_headroom = 0.10;
  const SearchResult kept = search_layouts(s, {});
  ASSERT_FALSE(kept.ranked.empty());
  for (const Evaluation& e : kept.ranked) {
    EXPECT_LE(e.memory.total, 0.9 * usable);
    EXPECT_DOUBLE_EQ(e.memory.capacity, 0.9 * usable);
  }
  EXPECT_LT(kept.feasible, full.feasible);
  EXPECT_GT(kept.rejected[size_t(RejectReason::kMemory)],
            full.rejected[size_t(RejectReason::kMemory)]);
  s.memory_headroom = 1.5;
  EXPECT_THROW(validate(s), ConfigError);
}

}  // namespace
}  // namespace lattice::plan
