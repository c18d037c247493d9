#include "plan/time_model.h"

#include <gtest/gtest.h>

#include "plan/collective_cost.h"
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

}  // namespace
}  // namespace lattice::plan
