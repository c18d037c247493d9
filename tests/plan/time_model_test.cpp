#include "plan/time_model.h"

#include <gtest/gtest.h>

#include "plan/activation_memory.h"
#include "plan/collective_cost.h"
#include "plan/evaluation.h"
#include "plan/memory_model.h"
#include "plan/pipeline_theory.h"
#include "plan_test_setups.h"

namespace lattice::plan {
namespace {

using testing::setup_for;

TEST(TimeModel, ModelFlopsFollowThePalmConvention) {
  TrainingSetup s = setup_for("gpt2-124m", "dgx-a100", 8, 64, 1024);
  const double psi = double(count_parameters(s.model).total);
  EXPECT_DOUBLE_EQ(model_flops_per_step(s), (6 * psi + 12.0 * 12 * 768 * 1024) * 64 * 1024);
}

TEST(TimeModel, PipelineScatterGatherAllGathersOnTheReceiverWithoutSequenceParallelism) {
  // Narayanan et al. 2021 §4.1: without SP each tp rank sends its 1/t of the b·s·h boundary
  // tensor between stages and the receiver all-gathers the slices over NVLink, once per chunk
  // boundary forward and once backward. Under SP the tensor is already split: no gather.
  TrainingSetup s = testing::llama70b_on_1024_h100();
  Layout layout{.dp = 16,
                .tp = 8,
                .pp = 8,
                .virtual_stages = 2,
                .zero = 1,
                .micro_batch = 1,
                .schedule = Schedule::kInterleaved1F1B};
  const int64_t m = micro_batches(layout, s.global_batch);
  const double bsh = s.bytes().activation * double(s.seq_len) * double(s.model.d_model);
  const double send =
      collective_seconds(s.cluster, CollectiveOp::kSendRecv, Transport::kInterNode, 2, bsh / 8.0);
  const double gather =
      collective_seconds(s.cluster, CollectiveOp::kAllGather, Transport::kIntraNode, 8, bsh);
  EXPECT_NEAR(estimate_time(s, layout).pp_communication, double(m) * 2.0 * 2.0 * (send + gather),
              1e-9);
  layout.sequence_parallel = true;
  EXPECT_NEAR(estimate_time(s, layout).pp_communication, double(m) * 2.0 * 2.0 * send, 1e-9);
}

TEST(TimeModel, StepIsTheSumOfItsParts) {
  TrainingSetup s = testing::llama70b_on_1024_h100();
  const Layout layout{.dp = 16,
                      .tp = 8,
                      .pp = 8,
                      .virtual_stages = 5,
                      .zero = 1,
                      .micro_batch = 1,
                      .recompute = Recompute::kSelective,
                      .sequence_parallel = true,
                      .schedule = Schedule::kInterleaved1F1B};
  const TimeBreakdown t = estimate_time(s, layout);
  // The pipeline part (m · slowest stage + bubble) plus exposed dp traffic plus the optimizer;
  // the last stage is the slowest (it owns the output layer), so the per-part sums add up.
  EXPECT_NEAR(t.step,
              t.forward + t.backward + t.recompute + t.tp_communication + t.pp_communication +
                  t.bubble + t.dp_communication + t.optimizer,
              1e-9 * t.step);
  EXPECT_DOUBLE_EQ(t.bubble_ratio, bubble_ratio(Schedule::kInterleaved1F1B, 8, 64, 5));
  EXPECT_EQ(t.tp_link, Transport::kIntraNode);
  EXPECT_EQ(t.dp_link, Transport::kInterNode);
  EXPECT_LE(t.dp_communication, t.dp_communication_total);
  EXPECT_DOUBLE_EQ(t.mfu * t.step * 1024 * 989e12, t.model_flops);
  EXPECT_GT(t.mfu, 0.2);
  EXPECT_LT(t.mfu, 0.8);
}

TEST(TimeModel, FullRecomputeAddsAForwardAndCountsOnlyInHfu) {
  TrainingSetup s = setup_for("gpt2-350m", "dgx-a100", 8, 64, 1024);
  Layout layout{.dp = 8, .micro_batch = 2};
  const TimeBreakdown plain = estimate_time(s, layout);
  layout.recompute = Recompute::kFull;
  const TimeBreakdown full = estimate_time(s, layout);
  EXPECT_GT(full.recompute, 0.0);
  EXPECT_GT(full.step, plain.step);
  EXPECT_DOUBLE_EQ(full.model_flops, plain.model_flops);
  EXPECT_GT(full.hfu, full.mfu);
  EXPECT_DOUBLE_EQ(plain.hfu, plain.mfu);
}

// A sparse model's FLOPs count the parameters a token uses; its all-to-alls cost nothing
// without expert parallelism, stay on NVLink while tp·ep fits a node, and cross nodes beyond.
TEST(TimeModel, ExpertAllToAllsArePricedOnTheLinkTheirGroupCrosses) {
  TrainingSetup s = setup_for("mixtral-8x7b", "dgx-h100", 64, 512, 4096);
  const ParameterCounts c = count_parameters(s.model);
  EXPECT_DOUBLE_EQ(model_flops_per_step(s),
                   (6.0 * double(c.active) + 12.0 * 32 * 4096 * 4096) * 512 * 4096);
  const Layout none{.dp = 64, .zero = 1, .micro_batch = 1};
  Layout inside = none, across = none;
  inside.ep = 8;
  across.tp = 2, across.dp = 32, across.ep = 8;  // tp · ep = 16 ranks: two nodes
  ASSERT_FALSE(check_layout(s, inside).has_value());
  ASSERT_FALSE(check_layout(s, across).has_value());
  const TimeBreakdown a = estimate_time(s, none), b = estimate_time(s, inside),
                      x = estimate_time(s, across);
  EXPECT_DOUBLE_EQ(a.ep_communication, 0.0);
  EXPECT_GT(b.ep_communication, 0.0);
  EXPECT_EQ(b.ep_link, Transport::kIntraNode);
  EXPECT_EQ(x.ep_link, Transport::kInterNode);
  EXPECT_GT(x.ep_communication, 3.0 * b.ep_communication);
  // Four exchanges a layer and micro-batch: dispatch and combine forward and backward, each of
  // the tokens' k·h routed values, (ep − 1)/ep of them leaving the rank.
  const double tokens = 4096, per_exchange = tokens * 2 * 4096 * 2.0;
  const double layers = 32, micro = 512.0 / 64;
  const double floor = 4 * layers * micro * per_exchange * 7.0 / 8.0 /
                       (s.cluster.intra_node.peak_bytes_per_s * s.cluster.intra_node.achievable);
  EXPECT_GT(b.ep_communication, floor);
  EXPECT_LT(b.ep_communication, 2.0 * floor);
  // The same step adds up with the exchanges in it.
  EXPECT_NEAR(b.step,
              b.forward + b.backward + b.recompute + b.tp_communication + b.ep_communication +
                  b.pp_communication + b.bubble + b.dp_communication + b.optimizer,
              1e-9 * b.step);
  // A dense model refuses ep; a sparse one refuses an ep that divides neither dp nor E, and
  // ZeRO-2 with ep.
  TrainingSetup dense = setup_for("llama-3-8b", "dgx-h100", 64, 512, 4096);
  EXPECT_TRUE(check_layout(dense, inside).has_value());
  Layout odd = none;
  odd.ep = 3;
  EXPECT_TRUE(check_layout(s, odd).has_value());
  Layout zero2 = inside;
  zero2.zero = 2;
  ASSERT_TRUE(check_layout(s, zero2).has_value());
  EXPECT_NE(check_layout(s, zero2)->message.find("use zero 0 or 1 with ep"), std::string::npos);
}

TEST(TimeModel, TensorParallelAcrossNodesIsSlowerThanInside) {
  TrainingSetup s = setup_for("gpt3-175b", "dgx-a100", 1024, 1024, 2048);
  const Layout inside{.dp = 16, .tp = 8, .pp = 8, .micro_batch = 1, .sequence_parallel = true};
  const Layout across{.dp = 8, .tp = 16, .pp = 8, .micro_batch = 1, .sequence_parallel = true};
  const TimeBreakdown a = estimate_time(s, inside), b = estimate_time(s, across);
  EXPECT_EQ(b.tp_link, Transport::kInterNode);
  EXPECT_GT(b.tp_communication, 3.0 * a.tp_communication);
}

TEST(TimeModel, CalibratedGemmEfficiencyMovesThePrediction) {
  TrainingSetup s = setup_for("gpt2-124m", "dgx-a100", 8, 64, 1024);
  const Layout layout{.dp = 8, .micro_batch = 8};
  const double before = estimate_time(s, layout).forward;
  // Measured: half of what the uncalibrated curve predicts at a typical shape.
  const double curve = gemm_efficiency(s.cluster, Precision::kBf16, 8192, 768, 768);
  s.cluster.gemm.push_back(
      {.precision = Precision::kBf16, .m = 8192, .n = 768, .k = 768, .efficiency = curve / 2});
  EXPECT_DOUBLE_EQ(gemm_efficiency(s.cluster, Precision::kBf16, 8192, 768, 768), curve / 2);
  const double after = estimate_time(s, layout).forward;
  EXPECT_GT(after, 1.5 * before);
}

// What the Lattice runtime adds to Megatron's model (docs/planner.md, Time model): selective
// recompute reruns the attention forward; the embedding's and the vocabulary-parallel
// cross-entropy's tp collectives; ZeRO-1's broadcast of the updated master shards and the step's
// scalar all-reduces, all in `synchronisation`.
TEST(TimeModel, LatticeRuntimePricesWhatItRuns) {
  TrainingSetup s = setup_for("gpt2-124m", "dgx-h100", 2, 8, 1024);
  s.runtime = Runtime::kLattice;
  TrainingSetup megatron = s;
  megatron.runtime = Runtime::kMegatron;

  Layout selective{.micro_batch = 8, .recompute = Recompute::kSelective};
  s.devices = megatron.devices = 1;
  EXPECT_GT(estimate_time(s, selective).recompute, 0.0);
  EXPECT_DOUBLE_EQ(estimate_time(megatron, selective).recompute, 0.0)
      << "flash attention: Megatron's selective recompute has nothing left to redo";

  s.devices = megatron.devices = 2;
  const Layout tp{.tp = 2, .micro_batch = 8};
  const TimeBreakdown lattice_tp = estimate_time(s, tp), megatron_tp = estimate_time(megatron, tp);
  EXPECT_GT(lattice_tp.tp_communication, megatron_tp.tp_communication);
  EXPECT_GT(lattice_tp.synchronisation, 0.0);  // the tp grad-norm all-reduce
  EXPECT_DOUBLE_EQ(megatron_tp.synchronisation, 0.0);
  EXPECT_NEAR(lattice_tp.step,
              lattice_tp.forward + lattice_tp.backward + lattice_tp.recompute +
                  lattice_tp.tp_communication + lattice_tp.dp_communication +
                  lattice_tp.synchronisation + lattice_tp.optimizer,
              1e-9 * lattice_tp.step);

  const Layout zero0{.dp = 2, .micro_batch = 4}, zero1{.dp = 2, .zero = 1, .micro_batch = 4};
  const TimeBreakdown z0 = estimate_time(s, zero0), z1 = estimate_time(s, zero1);
  // Lattice's ZeRO-1 reduces gradients as ZeRO-0 does, then broadcasts the f32 master shards.
  const double master = 4.0 * stage_parameter_count(s.model, zero1, 0, s.model.n_layers);
  const double broadcast =
      collective_seconds(s.cluster, CollectiveOp::kAllGather, z1.dp_link, 2, master);
  EXPECT_DOUBLE_EQ(z1.dp_communication, z0.dp_communication);
  const double scalar = collective_seconds(s.cluster, CollectiveOp::kAllReduce, z1.dp_link, 2, 8.0);
  EXPECT_GT(broadcast, 0.0);
  EXPECT_NEAR(z1.synchronisation - z0.synchronisation, broadcast + scalar, 1e-12)
      << "the broadcast and the grad norm's dp all-reduce";
  EXPECT_NEAR(z1.dp_communication_total, z0.dp_communication_total + broadcast, 1e-12);
}

TEST(TimeModel, MegatronsSequenceParallelGathersTheNormOutputsAgainInTheBackward) {
  // A layer's share of the tp traffic, read as the difference two more layers make (the
  // embedding's and the head's collectives do not depend on the layer count): under SP
  // 4 × (all-gather + reduce-scatter) of b·s·h, plus Megatron's 2 backward re-gathers of the norm
  // outputs; Lattice keeps the gathered input and has none (docs/tensor-parallel.md's list).
  TrainingSetup s = setup_for("gpt3-175b", "dgx-a100", 8, 8, 2048);
  const Layout sp{.dp = 1, .tp = 8, .micro_batch = 1, .sequence_parallel = true};
  const double bytes = 2.0 * 2048 * 12288;
  auto price = [&](CollectiveOp op) {
    return collective_seconds(s.cluster, op, Transport::kIntraNode, 8, bytes);
  };
  const double shared = 4 * (price(CollectiveOp::kAllGather) + price(CollectiveOp::kReduceScatter));
  auto per_layer = [&](Runtime runtime) {
    TrainingSetup two = s, four = s;
    two.runtime = four.runtime = runtime;
    two.model.n_layers = 2, four.model.n_layers = 4;
    const double m = double(micro_batches(sp, s.global_batch));
    return (estimate_time(four, sp).tp_communication - estimate_time(two, sp).tp_communication) /
           (2 * m);
  };
  EXPECT_NEAR(per_layer(Runtime::kMegatron), shared + 2 * price(CollectiveOp::kAllGather),
              1e-9 * shared);
  EXPECT_NEAR(per_layer(Runtime::kLattice), shared, 1e-9 * shared);
}

TEST(TimeModel, SelectiveRecomputeWithoutFusedAttentionRerunsTheScoreSweeps) {
  // Korthikanti et al.'s setting (s×s scores stored, dropout on): selective recompute reruns
  // the two attention GEMMs and the sweeps over the scores — the bytes it stops storing, written
  // and read once. With flash attention it reruns nothing.
  TrainingSetup s = setup_for("gpt3-175b", "dgx-a100", 64, 64, 2048);
  s.flash_attention = false;
  s.dropout = true;
  const Layout selective{.dp = 1,
                         .tp = 8,
                         .pp = 8,
                         .micro_batch = 1,
                         .recompute = Recompute::kSelective,
                         .sequence_parallel = true};
  ActivationOptions stored{.micro_batch = 1,
                           .seq_len = 2048,
                           .tp = 8,
                           .sequence_parallel = true,
                           .recompute = Recompute::kNone,
                           .dropout = true,
                           .flash_attention = false,
                           .activation_bytes = 2};
  ActivationOptions kept = stored;
  kept.recompute = Recompute::kSelective;
  const double sweeps =
      2.0 * (layer_activation_bytes(s.model, stored) - layer_activation_bytes(s.model, kept)) /
      s.cluster.device.hbm_bytes_per_s;
  const double heads = 96.0 / 8, hd = 128, seq = 2048;
  const double gemm_rate_qk =
      s.cluster.peak_flops(s.precision) * gemm_efficiency(s.cluster, s.precision, seq, seq, hd);
  const double gemm_rate_pv =
      s.cluster.peak_flops(s.precision) * gemm_efficiency(s.cluster, s.precision, seq, hd, seq);
  const double core =
      2 * seq * seq * hd * heads / gemm_rate_qk + 2 * seq * hd * seq * heads / gemm_rate_pv;
  const int64_t m = micro_batches(selective, s.global_batch);
  EXPECT_NEAR(estimate_time(s, selective).recompute, double(m) * 12 * (core + sweeps), 1e-9 * core);
  EXPECT_GT(sweeps, core);  // at s = 2048 the sweeps cost more than the GEMMs they surround
  s.flash_attention = true;
  s.dropout = false;
  EXPECT_EQ(estimate_time(s, selective).recompute, 0.0);
}

TEST(TimeModel, ASoftwareProfilesFactorsScaleWhatTheyName) {
  // layer_overhead_s adds its seconds per layer and micro-batch forward, twice backward;
  // compute_efficiency divides every GEMM's rate.
  TrainingSetup s = setup_for("gpt2-1.5b", "dgx-a100", 8, 64, 1024);
  const Layout dp{.dp = 8, .micro_batch = 2};
  s.cluster.runtime.layer_overhead_s = 0;
  const TimeBreakdown base = estimate_time(s, dp);
  s.cluster.runtime.layer_overhead_s = 1e-3;
  const TimeBreakdown overhead = estimate_time(s, dp);
  const double m = double(micro_batches(dp, s.global_batch));
  EXPECT_NEAR(overhead.forward - base.forward, m * 48 * 1e-3, 1e-9);
  EXPECT_NEAR(overhead.backward - base.backward, m * 48 * 2e-3, 1e-9);
  s.cluster.runtime.layer_overhead_s = 0;
  s.cluster.runtime.compute_efficiency = 0.5;
  const TimeBreakdown half = estimate_time(s, dp);
  EXPECT_GT(half.forward, 1.5 * base.forward);  // GEMMs doubled; element-wise work unchanged
  EXPECT_LT(half.forward, 2.0 * base.forward);
}

TEST(TimeModel, FsdpShardGradOpGathersTheParametersEveryMicroBatch) {
  // ZeRO-2 as DeepSpeed runs it gathers the updated parameters once a step; PyTorch FSDP's
  // SHARD_GRAD_OP reshards them after every backward, so each micro-batch gathers them again:
  // m − 1 more all-gathers of the rank's parameters over the replicas (Llama 3's FSDP).
  TrainingSetup s = setup_for("gpt2-1.5b", "dgx-a100", 64, 512, 1024);
  const Layout zero2{.dp = 64, .zero = 2, .micro_batch = 2};
  const TimeBreakdown once = estimate_time(s, zero2);
  s.cluster.runtime.zero2_regathers_per_micro_batch = true;
  const TimeBreakdown every = estimate_time(s, zero2);
  const double m = double(micro_batches(zero2, s.global_batch));
  ASSERT_GT(m, 1.0);
  const double params = stage_parameter_count(s.model, zero2, 0, s.model.n_layers);
  const double gather = collective_seconds(s.cluster, CollectiveOp::kAllGather, every.dp_link, 64,
                                           params * s.bytes().parameter);
  EXPECT_NEAR(every.dp_communication_total - once.dp_communication_total, (m - 1) * gather,
              1e-9 * every.dp_communication_total);
  EXPECT_GE(every.dp_communication, once.dp_communication);
  EXPECT_NEAR(every.step - once.step, every.dp_communication - once.dp_communication,
              1e-9 * every.step);
}

TEST(TimeModel, TheLastGradientBucketIsNeverHidden) {
  // Even with the whole reduction hideable (dp_overlap 1), the last bucket's share is exposed:
  // it starts when the backward ends.
  TrainingSetup s = setup_for("gpt2-1.5b", "dgx-a100", 64, 512, 1024);
  s.cluster.runtime.dp_overlap = 1.0;
  const Layout dp{.dp = 64, .micro_batch = 8};
  const TimeBreakdown t = estimate_time(s, dp);
  const double grad_bytes = 2.0 * stage_parameter_count(s.model, dp, 0, s.model.n_layers);
  EXPECT_GT(t.dp_communication, 0.0);
  EXPECT_NEAR(t.dp_communication,
              t.dp_communication_total * s.cluster.runtime.dp_bucket_bytes / grad_bytes,
              1e-9 * t.dp_communication_total);
}

}  // namespace
}  // namespace lattice::plan

namespace lattice::plan {
namespace {

// Context parallelism splits the positions, not the work: at the same devices, dp 2 and cp 2
// give each rank the same tokens and the same attention FLOPs (the ring balances the causal
// work), so the compute matches; the activations halve.
TEST(TimeModel, ContextParallelismSplitsTheSequencesWorkEvenly) {
  TrainingSetup s = testing::setup_for("llama-3-8b", "dgx-h100", 2, 8, 32768);
  const Layout dp2{.dp = 2, .micro_batch = 1, .recompute = Recompute::kFull};
  Layout cp2 = dp2;
  cp2.dp = 1;
  cp2.cp = 2;
  ASSERT_FALSE(check_layout(s, cp2).has_value());
  const TimeBreakdown a = estimate_time(s, dp2), b = estimate_time(s, cp2);
  EXPECT_NEAR(b.forward / a.forward, 1.0, 0.05);
  EXPECT_NEAR(b.backward / a.backward, 1.0, 0.05);
  EXPECT_DOUBLE_EQ(b.tokens_per_second * b.step, a.tokens_per_second * a.step);
  EXPECT_NEAR(estimate_memory(s, cp2).activations / estimate_memory(s, dp2).activations, 0.5, 1e-9);
}

// The ring's hops hide behind their chunk products when these are large (a long sequence on
// NVLink): what is left is the last hop of each layer's gradient sums, to the block's owner,
// which nothing follows; a small model's hops across nodes are not hidden. Lattice's gradient
// hops carry f32, Megatron-LM's TransformerEngine's the activation dtype.
TEST(TimeModel, TheRingIsExposedOnlyWhereItsProductsCannotHideIt) {
  TrainingSetup s = testing::setup_for("llama-3-8b", "dgx-h100", 8, 8, 65536);
  s.runtime = Runtime::kMegatron;
  const Layout intra{.dp = 1, .micro_batch = 1, .recompute = Recompute::kFull, .cp = 8};
  const TimeBreakdown hidden = estimate_time(s, intra);
  EXPECT_EQ(hidden.cp_link, Transport::kIntraNode);
  EXPECT_GT(hidden.cp_communication, 0.0);
  EXPECT_LT(hidden.cp_communication, 0.005 * hidden.step);

  TrainingSetup small = testing::setup_for("gpt2-124m", "dgx-h100", 16, 16, 8192);
  small.runtime = Runtime::kMegatron;
  const Layout across{.dp = 1, .tp = 8, .micro_batch = 1, .sequence_parallel = true, .cp = 2};
  const TimeBreakdown megatron = estimate_time(small, across);
  EXPECT_EQ(megatron.cp_link, Transport::kInterNode);
  EXPECT_GT(megatron.cp_communication, 0.0);
  small.runtime = Runtime::kLattice;
  EXPECT_GT(estimate_time(small, across).cp_communication, megatron.cp_communication);
}

TEST(TimeModel, ASequenceThatDoesNotCutInto2CpChunksIsRejected) {
  TrainingSetup s = testing::setup_for("llama-3-8b", "dgx-h100", 6, 6, 4096);
  const Layout cp3{.dp = 2, .micro_batch = 1, .cp = 3};
  const auto rejection = check_layout(s, cp3);
  ASSERT_TRUE(rejection.has_value());
  EXPECT_NE(rejection->message.find("2·cp = 6 equal chunks"), std::string::npos)
      << rejection->message;
}

}  // namespace
}  // namespace lattice::plan
