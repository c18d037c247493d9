#include "plan/evaluation.h"

#include <gtest/gtest.h>

#include <string>

#include "plan_test_setups.h"

namespace lattice::plan {
namespace {

using testing::setup_for;

void expect_rejected(const TrainingSetup& s, const Layout& layout, RejectReason reason,
                     const std::string& mentions) {
  Evaluation e = evaluate(s, layout);
  ASSERT_FALSE(e.feasible()) << describe(layout);
  EXPECT_EQ(e.rejection->reason, reason) << e.rejection->message;
  EXPECT_NE(e.rejection->message.find(mentions), std::string::npos) << e.rejection->message;
}

TEST(Rejections, TensorParallelBeyondTheKeyValueHeads) {
  // Llama-3-70B has 8 kv heads: tp 16 cannot split them.
  expect_rejected(testing::llama70b_on_1024_h100(), {.dp = 8, .tp = 16, .pp = 8},
                  RejectReason::kDivisibility, "key/value heads");
}

TEST(Rejections, PipelineStagesThatDoNotDivideTheLayers) {
  // 80 layers over 3 stages.
  expect_rejected(setup_for("llama-3-70b", "dgx-h100", 24, 48, 4096), {.dp = 1, .tp = 8, .pp = 3},
                  RejectReason::kDivisibility, "80 layers");
  // 80 layers over 8 stages × 3 chunks.
  expect_rejected(
      testing::llama70b_on_1024_h100(),
      {.dp = 16, .tp = 8, .pp = 8, .virtual_stages = 3, .schedule = Schedule::kInterleaved1F1B},
      RejectReason::kDivisibility, "v 3");
}

TEST(Rejections, GlobalBatchNotDivisibleByDataParallelTimesMicroBatch) {
  expect_rejected(setup_for("gpt2-124m", "dgx-a100", 8, 100, 1024), {.dp = 8, .micro_batch = 1},
                  RejectReason::kBatch, "multiple of dp 8");
}

TEST(Rejections, ProductOfSizesIsNotTheDeviceCount) {
  expect_rejected(setup_for("gpt2-124m", "dgx-a100", 8, 64, 1024), {.dp = 4, .tp = 1, .pp = 1},
                  RejectReason::kDeviceCount, "8 devices");
}

TEST(Rejections, ScheduleRules) {
  TrainingSetup s = testing::llama70b_on_1024_h100();
  // m = 1024 / (dp 16 · b 16) = 4 micro-batches, not a multiple of pp 8.
  expect_rejected(s,
                  {.dp = 16,
                   .tp = 8,
                   .pp = 8,
                   .virtual_stages = 2,
                   .micro_batch = 16,
                   .schedule = Schedule::kInterleaved1F1B},
                  RejectReason::kSchedule, "multiple of pp 8");
  expect_rejected(s, {.dp = 16, .tp = 8, .pp = 8, .virtual_stages = 2}, RejectReason::kSchedule,
                  "interleaved");
  expect_rejected(s, {.dp = 16, .tp = 8, .pp = 8, .schedule = Schedule::kInterleaved1F1B},
                  RejectReason::kSchedule, "v ≥ 2");
}

TEST(Rejections, SeventyBillionParametersDoNotFitDataParallelOnly) {
  // 16 bytes × 70.6B parameters per device: the optimizer states alone are 12 × 70.6B.
  TrainingSetup s = setup_for("llama-3-70b", "dgx-h100", 8, 64, 4096);
  Evaluation e = evaluate(s, {.dp = 8, .micro_batch = 1});
  ASSERT_FALSE(e.feasible());
  EXPECT_EQ(e.rejection->reason, RejectReason::kMemory);
  EXPECT_NE(e.rejection->message.find("optimizer states"), std::string::npos)
      << e.rejection->message;
  EXPECT_NE(e.rejection->message.find("ZeRO"), std::string::npos) << e.rejection->message;
  EXPECT_GT(e.memory.total, 16.0 * 70e9);
}

TEST(Rejections, ActivationBoundLayoutPointsAtRecompute) {
  TrainingSetup s = setup_for("gpt2-1.5b", "dgx-a100", 8, 512, 1024);
  s.flash_attention = false;
  s.dropout = true;
  Evaluation e = evaluate(s, {.dp = 8, .micro_batch = 64});
  ASSERT_FALSE(e.feasible());
  EXPECT_EQ(e.rejection->reason, RejectReason::kMemory);
  EXPECT_NE(e.rejection->message.find("activations"), std::string::npos) << e.rejection->message;
  EXPECT_NE(e.rejection->message.find("recompute"), std::string::npos) << e.rejection->message;
}

TEST(Evaluation, FeasibleLayoutHasConsistentFigures) {
  TrainingSetup s = setup_for("gpt2-124m", "dgx-a100", 8, 64, 1024);
  Evaluation e = evaluate(s, {.dp = 8, .micro_batch = 8});
  ASSERT_TRUE(e.feasible()) << e.rejection->message;
  EXPECT_LT(e.memory.total, e.memory.capacity);
  EXPECT_GT(e.time.mfu, 0.0);
  EXPECT_LT(e.time.mfu, 1.0);
  EXPECT_DOUBLE_EQ(e.time.tokens_per_second, 64.0 * 1024 / e.time.step);
}

}  // namespace
}  // namespace lattice::plan
