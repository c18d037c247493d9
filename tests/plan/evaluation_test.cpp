#include "plan/evaluation.h"

#include <gtest/gtest.h>

#include <algorithm>
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

TEST(Rejections, MorePipelineChunksThanLayersOrASplitThatDoesNotSumToThem) {
  // 80 layers over 8 stages × 16 chunks.
  expect_rejected(
      testing::llama70b_on_1024_h100(),
      {.dp = 16, .tp = 8, .pp = 8, .virtual_stages = 16, .schedule = Schedule::kInterleaved1F1B},
      RejectReason::kDivisibility, "only 80 layers");
  // A given split of 30 layers for a model of 80.
  const TrainingSetup s = setup_for("llama-3-70b", "dgx-h100", 24, 48, 4096);
  expect_rejected(s, {.dp = 1, .tp = 8, .pp = 3, .layers_per_chunk = {10, 10, 10}},
                  RejectReason::kDivisibility, "summing to the 80 layers");
}

TEST(UnevenPipeline, LayersThatDoNotDivideTakeTheBalancedPartition) {
  // 80 layers over 3 stages: once rejected, now split as the runtime splits them (the head's
  // stage holds fewer), and priced by its slowest stage.
  const TrainingSetup s = setup_for("llama-3-70b", "dgx-h100", 24, 48, 4096);
  const Layout uneven{.dp = 1, .tp = 8, .pp = 3, .micro_batch = 1, .recompute = Recompute::kFull};
  EXPECT_FALSE(check_layout(s, uneven).has_value());
  const std::vector<int64_t> counts = chunk_layer_counts(s, uneven);
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts[0] + counts[1] + counts[2], 80);
  EXPECT_LE(counts[2], counts[0]);  // the head's stage
  EXPECT_LE(*std::max_element(counts.begin(), counts.end()) -
                *std::min_element(counts.begin(), counts.end()),
            1);
  // The same model on a given split that loads the first stage with 40 layers is slower and
  // needs more memory on that stage: the step follows the slowest stage.
  Layout lopsided = uneven;
  lopsided.layers_per_chunk = {40, 20, 20};
  const Evaluation balanced = evaluate(s, uneven), heavy = evaluate(s, lopsided);
  EXPECT_GT(heavy.time.step, 1.3 * balanced.time.step);
  EXPECT_GT(estimate_stage_memory(s, lopsided, 0).parameters,
            1.9 * estimate_stage_memory(s, lopsided, 1).parameters);
  EXPECT_EQ(stage_layers(s, lopsided, 0), 40);
  EXPECT_NE(describe(lopsided).find("layers=40,20×2"), std::string::npos) << describe(lopsided);
}

TEST(UnevenPipeline, Llama3s126LayersOn16StagesFitAsPublished) {
  // Dubey et al. 2024: tp 8, pp 16, one layer fewer on the first and the last stage, no
  // recompute, 8,192 tokens, 2,048 sequences on 8,192 H100s.
  TrainingSetup s = setup_for("llama-3-405b", "dgx-h100", 8192, 2048, 8192);
  const Layout published{.dp = 64,
                         .tp = 8,
                         .pp = 16,
                         .zero = 2,
                         .micro_batch = 1,
                         .sequence_parallel = true,
                         .layers_per_chunk = {7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7}};
  const Evaluation e = evaluate(s, published);
  EXPECT_TRUE(e.feasible()) << (e.rejection ? e.rejection->message : "");
  // Without the split the first stage holds 8 layers' activations for 16 micro-batches in
  // flight: more memory on the stage that binds.
  Layout even_ends = published;
  even_ends.layers_per_chunk = {8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7, 7};
  EXPECT_GT(estimate_stage_memory(s, even_ends, 0).activations,
            estimate_stage_memory(s, published, 0).activations);
}

TEST(UnevenPipeline, Llama3sEmbeddingOnlyAndHeadOnlyChunksInterleaved) {
  // Dubey et al. 2024 §3.3.2: interleaved, the first model chunk holds only the embedding and the
  // last only the head; with one-layer chunks v = 8 over 16 stages and 126 layers. It fits at
  // 8,192 GPUs (32 micro-batches a pipeline); Lattice's own partition gives every chunk a layer.
  TrainingSetup s = setup_for("llama-3-405b", "dgx-h100", 8192, 2048, 8192);
  s.cluster.runtime.fragmentation = 0;  // live bytes, as plan --validate-published judges them
  Layout published{.dp = 64,
                   .tp = 8,
                   .pp = 16,
                   .virtual_stages = 8,
                   .zero = 2,
                   .micro_batch = 1,
                   .sequence_parallel = true,
                   .schedule = Schedule::kInterleaved1F1B};
  published.layers_per_chunk.assign(128, 1);
  published.layers_per_chunk.front() = published.layers_per_chunk.back() = 0;
  const Evaluation e = evaluate(s, published);
  EXPECT_TRUE(e.feasible()) << (e.rejection ? e.rejection->message : "");
  EXPECT_EQ(stage_layers(s, published, 0), 7);
  EXPECT_EQ(stage_layers(s, published, 1), 8);
  EXPECT_EQ(stage_layers(s, published, 15), 7);
  EXPECT_NE(describe(published).find("layers=0,1×126,0"), std::string::npos);
  // Only the two ends may be empty, and every stage keeps a layer.
  Layout hollow = published;
  hollow.layers_per_chunk[1] = 0, hollow.layers_per_chunk[2] = 2;
  EXPECT_EQ(evaluate(s, hollow).rejection->reason, RejectReason::kDivisibility);
  s.runtime = Runtime::kLattice;
  published.zero = 1;  // (Lattice's pipelines run ZeRO 0 and 1 only)
  EXPECT_EQ(evaluate(s, published).rejection->reason, RejectReason::kDivisibility);
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
