#include "plan/memory_model.h"

#include <gtest/gtest.h>

#include "plan/activation_memory.h"
#include "plan/pipeline_theory.h"
#include "plan_test_setups.h"

namespace lattice::plan {
namespace {

using testing::setup_for;

// Rajbhandari et al. 2019, Figure 1: Ψ = 7.5B, N = 64, K = 12 → 120, 31.4, 16.6, 1.9 GB.
TEST(ModelStates, ZeroPaperExample) {
  const StateBytes mixed;
  const double psi = 7.5e9;
  EXPECT_DOUBLE_EQ(model_state_bytes(psi, 64, 0, mixed).total(), 120e9);
  EXPECT_DOUBLE_EQ(model_state_bytes(psi, 64, 1, mixed).total(), 4 * psi + 12 * psi / 64);
  EXPECT_DOUBLE_EQ(model_state_bytes(psi, 64, 2, mixed).total(), 2 * psi + 14 * psi / 64);
  EXPECT_DOUBLE_EQ(model_state_bytes(psi, 64, 3, mixed).total(), 16 * psi / 64);
  EXPECT_NEAR(model_state_bytes(psi, 64, 1, mixed).total() / 1e9, 31.4, 0.05);
  EXPECT_NEAR(model_state_bytes(psi, 64, 2, mixed).total() / 1e9, 16.6, 0.05);
  EXPECT_NEAR(model_state_bytes(psi, 64, 3, mixed).total() / 1e9, 1.9, 0.05);
}

TEST(ModelStates, Fp32GradientVariantIsMegatrons18BytesPerParameter) {
  TrainingSetup s = setup_for("gpt2-124m", "dgx-a100", 8, 64, 1024);
  s.fp32_gradients = true;
  EXPECT_DOUBLE_EQ(model_state_bytes(1e9, 8, 0, s.bytes()).total(), 18e9);
}

TEST(StageParameters, ShardsSumToTheModel) {
  // Over all stages and tp ranks, every parameter is held once, except what tensor parallelism
  // replicates (norms, row-parallel biases) and the last stage's copy of a tied embedding.
  const ModelSpec m = model_preset("gpt2-350m");
  const ParameterCounts counts = count_parameters(m);
  const Layout layout{.dp = 1, .tp = 4, .pp = 4};
  double sum = 0;
  for (int64_t stage = 0; stage < 4; ++stage)
    sum += 4 * stage_parameter_count(m, layout, stage, m.n_layers / 4);
  const double replicated_extra = 3.0 * double(m.n_layers * counts.per_layer_replicated) +
                                  3.0 * double(m.max_seq_len * m.d_model) +
                                  3.0 * double(counts.final_norm);
  const double tied_copy = double(m.padded_vocab_size * m.d_model);
  EXPECT_DOUBLE_EQ(sum, double(counts.total) + replicated_extra + tied_copy);
}

// Mixtral 8x7B on 64 H100s: each rank holds dense weights whole and 1/ep of the experts; ZeRO-1
// shards the experts' optimizer state over the dp / ep ranks holding the same experts, and the
// dense one over dp (Megatron-LM) or, as Lattice runs it, over dp / ep as well.
TEST(MemoryModel, ExpertsSplitOverEpAndTheirStatesShardOverTheirReplicas) {
  TrainingSetup s = setup_for("mixtral-8x7b", "dgx-h100", 64, 512, 4096);
  const ParameterCounts c = count_parameters(s.model);
  const Layout ep1{.dp = 64, .zero = 1};
  Layout ep8 = ep1;
  ep8.ep = 8;
  const double experts = double(s.model.n_layers * c.per_layer_experts);
  EXPECT_DOUBLE_EQ(stage_expert_parameter_count(s.model, ep1, s.model.n_layers), experts);
  EXPECT_DOUBLE_EQ(stage_expert_parameter_count(s.model, ep8, s.model.n_layers), experts / 8);
  const double whole = stage_parameter_count(s.model, ep1, 0, s.model.n_layers);
  EXPECT_DOUBLE_EQ(whole, double(c.total));
  const double held = stage_parameter_count(s.model, ep8, 0, s.model.n_layers);
  EXPECT_DOUBLE_EQ(held, double(c.total) - experts + experts / 8);

  const MemoryBreakdown megatron = estimate_memory(s, ep8);
  EXPECT_DOUBLE_EQ(megatron.parameter_count, held);
  EXPECT_DOUBLE_EQ(megatron.parameters, 2.0 * held);
  EXPECT_DOUBLE_EQ(megatron.optimizer_states, 12.0 * ((held - experts / 8) / 64 + experts / 8 / 8));
  EXPECT_EQ(zero_group(s, ep8, false), 64);
  EXPECT_EQ(zero_group(s, ep8, true), 8);

  s.runtime = Runtime::kLattice;
  EXPECT_EQ(zero_group(s, ep8, false), 8);
  EXPECT_DOUBLE_EQ(estimate_memory(s, ep8).optimizer_states, 8.0 * held / 8);
  // Without expert parallelism every rank holds every expert and ZeRO shards over all 64.
  EXPECT_DOUBLE_EQ(estimate_memory(s, ep1).optimizer_states, 8.0 * whole / 64);
  EXPECT_GT(estimate_memory(s, ep1).parameters, 7.0 * estimate_memory(s, ep8).parameters / 2);
}

TEST(MemoryModel, EveryComponentAddsUpAndMatchesItsFormula) {
  TrainingSetup s = setup_for("gpt2-774m", "dgx-a100", 16, 64, 1024);
  const Layout layout{.dp = 4,
                      .tp = 2,
                      .pp = 2,
                      .zero = 1,
                      .micro_batch = 2,
                      .recompute = Recompute::kSelective,
                      .sequence_parallel = true};
  const MemoryBreakdown mem = estimate_stage_memory(s, layout, 0);
  const double n = stage_parameter_count(s.model, layout, 0, s.model.n_layers / 2);
  EXPECT_DOUBLE_EQ(mem.parameters, 2 * n);
  EXPECT_DOUBLE_EQ(mem.gradients, 2 * n);
  EXPECT_DOUBLE_EQ(mem.optimizer_states, 12 * n / 4);
  // 1F1B, p = 2: stage 0 holds min(m, 2) = 2 micro-batches of its 18 layers.
  ActivationOptions o{.micro_batch = 2,
                      .seq_len = 1024,
                      .tp = 2,
                      .sequence_parallel = true,
                      .recompute = Recompute::kSelective};
  EXPECT_DOUBLE_EQ(mem.activations, 2 * 18 * layer_activation_bytes(s.model, o));
  EXPECT_EQ(mem.logits, 0.0);  // the output layer is on stage 1
  const double dynamic = mem.activations + mem.recompute_working + mem.embedding_activations +
                         mem.logits + mem.communication_buffers + mem.zero3_gathered;
  EXPECT_DOUBLE_EQ(mem.fragmentation, s.cluster.runtime.fragmentation * dynamic);
  EXPECT_DOUBLE_EQ(mem.total, mem.parameters + mem.gradients + mem.optimizer_states + dynamic +
                                  mem.fragmentation);

  const MemoryBreakdown last = estimate_stage_memory(s, layout, 1);
  // f32 logits of the vocabulary shard for one micro-batch, plus the final norm's (SP-sharded)
  // and the output layer's inputs.
  EXPECT_DOUBLE_EQ(last.logits, 4.0 * 1024 * 2 * 50304 / 2 + 2.0 * 1024 * 2 * 1280 * 1.5);
  EXPECT_EQ(last.activations, mem.activations / 2);  // 1 micro-batch in flight, not 2
}

TEST(MemoryModel, ZeroStagesShrinkTheirOwnComponent) {
  TrainingSetup s = setup_for("llama-3-8b", "dgx-h100", 64, 512, 8192);
  Layout layout{.dp = 8, .tp = 8, .pp = 1, .micro_batch = 1, .sequence_parallel = true};
  MemoryBreakdown previous = estimate_memory(s, layout);
  for (int zero = 1; zero <= 3; ++zero) {
    layout.zero = zero;
    MemoryBreakdown mem = estimate_memory(s, layout);
    EXPECT_LT(mem.total, previous.total) << "zero " << zero;
    if (zero == 1) {
      EXPECT_DOUBLE_EQ(mem.optimizer_states, previous.optimizer_states / 8);
    }
    if (zero == 2) {
      EXPECT_DOUBLE_EQ(mem.gradients, previous.gradients / 8);
    }
    if (zero == 3) {
      EXPECT_DOUBLE_EQ(mem.parameters, previous.parameters / 8);
      EXPECT_GT(mem.zero3_gathered, 0.0);
    }
    previous = mem;
  }
}

TEST(MemoryModel, GpipeHoldsEveryMicroBatchAndInterleavingAFraction) {
  TrainingSetup s = setup_for("gpt2-1.5b", "dgx-a100", 8, 64, 1024);
  Layout layout{.dp = 1, .tp = 1, .pp = 8, .micro_batch = 1};
  const double one_f_one_b = estimate_stage_memory(s, layout, 0).activations;
  layout.schedule = Schedule::kGpipe;
  EXPECT_DOUBLE_EQ(estimate_stage_memory(s, layout, 0).activations, one_f_one_b * 64 / 8);
  layout.schedule = Schedule::kInterleaved1F1B;
  layout.virtual_stages = 2;
  EXPECT_DOUBLE_EQ(estimate_stage_memory(s, layout, 0).activations,
                   one_f_one_b * (1.0 + 7.0 / 16.0));
}

}  // namespace
}  // namespace lattice::plan
