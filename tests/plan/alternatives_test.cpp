#include "plan/alternatives.h"

#include <gtest/gtest.h>

#include <string>

#include "plan/search.h"
#include "plan_test_setups.h"

namespace lattice::plan {
namespace {

using testing::setup_for;

const Alternative* find(const std::vector<Alternative>& alternatives, const std::string& change) {
  for (const Alternative& a : alternatives) {
    if (a.change.rfind(change, 0) == 0) return &a;
  }
  return nullptr;
}

TEST(Alternatives, NameTheResourceThatBinds) {
  // GPT-3 175B on 1024 A100s, tp 8 inside a node, pp 8, 1F1B.
  TrainingSetup s = setup_for("gpt3-175b", "dgx-a100", 1024, 1536, 2048);
  Evaluation best = evaluate(s, {.dp = 16,
                                 .tp = 8,
                                 .pp = 8,
                                 .zero = 1,
                                 .micro_batch = 1,
                                 .recompute = Recompute::kSelective,
                                 .sequence_parallel = true});
  ASSERT_TRUE(best.feasible()) << best.rejection->message;
  const std::vector<Alternative> alts = explain_alternatives(s, best);

  const Alternative* more_tp = find(alts, "tp 16");
  ASSERT_NE(more_tp, nullptr);
  EXPECT_NE(more_tp->verdict.find("cross nodes"), std::string::npos) << more_tp->verdict;
  EXPECT_NE(more_tp->verdict.find("pp instead"), std::string::npos) << more_tp->verdict;

  const Alternative* zero3 = find(alts, "zero 3");
  ASSERT_NE(zero3, nullptr);
  EXPECT_GT(zero3->slowdown, 1.5);
  EXPECT_NE(zero3->verdict.find("data-parallel traffic"), std::string::npos) << zero3->verdict;
  EXPECT_NE(zero3->verdict.find("between nodes"), std::string::npos) << zero3->verdict;

  const Alternative* plain = find(alts, "data parallel only");
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(plain->evaluation.feasible());

  const Alternative* gpipe = find(alts, "schedule gpipe");
  ASSERT_NE(gpipe, nullptr);
  EXPECT_EQ(gpipe->evaluation.rejection->reason, RejectReason::kMemory) << gpipe->verdict;
}

TEST(Alternatives, FewMicroBatchesBlameTheBubble) {
  // 8 micro-batches over 8 stages: 1F1B idles 7/8 of the compute; interleaving fixes that.
  TrainingSetup s = setup_for("gpt2-1.5b", "dgx-a100", 8, 8, 1024);
  Evaluation best = evaluate(s, {.dp = 1,
                                 .tp = 1,
                                 .pp = 8,
                                 .virtual_stages = 2,
                                 .micro_batch = 1,
                                 .schedule = Schedule::kInterleaved1F1B});
  ASSERT_TRUE(best.feasible()) << best.rejection->message;
  // Keep the list alive: `find` points into it.
  const std::vector<Alternative> alts = explain_alternatives(s, best);
  const Alternative* plain = find(alts, "schedule 1f1b");
  ASSERT_NE(plain, nullptr);
  EXPECT_GT(plain->slowdown, 1.0);
  EXPECT_NE(plain->verdict.find("bubble"), std::string::npos) << plain->verdict;
}

TEST(Alternatives, RecommendationFromTheSearchHasNoFasterNeighbourInsideTheConstraints) {
  TrainingSetup s = testing::llama70b_on_1024_h100();
  SearchResult r = search_layouts(s, {});
  ASSERT_FALSE(r.ranked.empty());
  for (const Alternative& a : explain_alternatives(s, r.ranked.front())) {
    if (a.evaluation.feasible()) {
      EXPECT_GE(a.slowdown, 1.0 - 1e-12) << a.change << ": " << a.verdict;
    }
  }
}

}  // namespace
}  // namespace lattice::plan
