#include "plan/activation_memory.h"

#include <gtest/gtest.h>

#include "plan/model_presets.h"

namespace lattice::plan {
namespace {

// Korthikanti et al.'s setting: dropout on, the s×s scores stored, 2-byte activations.
ActivationOptions paper_setting(int64_t b, int64_t s, int64_t t) {
  return {.micro_batch = b,
          .seq_len = s,
          .tp = t,
          .dropout = true,
          .flash_attention = false,
          .activation_bytes = 2};
}

struct Case {
  const char* preset;
  int64_t b, s, t;
};

class KorthikantiTable2 : public ::testing::TestWithParam<Case> {};

TEST_P(KorthikantiTable2, EveryRowMatchesTheFormula) {
  const Case c = GetParam();
  const ModelSpec m = model_preset(c.preset);
  const double s = double(c.s), b = double(c.b), h = double(m.d_model);
  const double a = double(m.n_heads), t = double(c.t), sbh = s * b * h;
  ActivationOptions o = paper_setting(c.b, c.s, c.t);

  auto bytes = [&](bool sp, Recompute r) {
    o.sequence_parallel = sp;
    o.recompute = r;
    return layer_activation_bytes(m, o);
  };
  const double tolerance = 1e-9 * sbh * 34;
  if (c.t == 1) {
    EXPECT_NEAR(bytes(false, Recompute::kNone), sbh * (34 + 5 * a * s / h), tolerance);
  }
  EXPECT_NEAR(bytes(false, Recompute::kNone), sbh * (10 + 24 / t + 5 * a * s / (h * t)), tolerance);
  EXPECT_NEAR(bytes(true, Recompute::kNone), sbh * (34 / t + 5 * a * s / (h * t)), tolerance);
  EXPECT_NEAR(bytes(false, Recompute::kSelective), sbh * (10 + 24 / t), tolerance);
  EXPECT_NEAR(bytes(true, Recompute::kSelective), 34 * sbh / t, tolerance);
  EXPECT_NEAR(bytes(false, Recompute::kFull), 2 * sbh, tolerance);
  EXPECT_NEAR(bytes(true, Recompute::kFull), 2 * sbh / t, tolerance);
}

// The paper's own configurations (GPT-3 175B at s 2048 and t 8, the 530B/1T shapes' smaller
// cousins) and small hand-sized ones.
INSTANTIATE_TEST_SUITE_P(Cases, KorthikantiTable2,
                         ::testing::Values(Case{"gpt3-175b", 1, 2048, 8},
                                           Case{"gpt2-1.5b", 4, 1024, 1},
                                           Case{"gpt2-350m", 2, 512, 4},
                                           Case{"gpt2-tiny", 2, 64, 2}));

TEST(ActivationMemory, Gpt2TinyWorkedByHand) {
  // s 64, b 2, h 64, a 4, t 1: sbh = 8192; 34 sbh = 278528; 5as²b = 5·4·4096·2 = 163840.
  ActivationOptions o = paper_setting(2, 64, 1);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(model_preset("gpt2-tiny"), o), 278528 + 163840);
}

TEST(ActivationMemory, LlamaTinyWithLatticeKernelsWorkedByHand) {
  // Lattice's runtime: flash attention, no dropout. s 64, b 1, h 64, kv 32, ffn 176, a 4.
  //   norm inputs + QKV input + MLP input: 4 · 2·64·64      = 32768
  //   Q, K, V: 2·64·(64 + 32 + 32) = 16384; attention out 2·64·64 = 8192
  //   SwiGLU gate, up, product: 3 · 2·64·176                 = 67584
  //   log-sum-exp: 4 bytes · a 4 · s 64                        = 1024
  ActivationOptions o{.micro_batch = 1, .seq_len = 64, .tp = 1};
  const ModelSpec m = model_preset("llama-tiny");
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, o), 32768 + 16384 + 8192 + 67584 + 1024);
  // Selective recompute has nothing to drop under flash attention.
  o.recompute = Recompute::kSelective;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, o), 32768 + 16384 + 8192 + 67584 + 1024);
  // Tensor parallelism over the 2 kv heads halves everything but the residual stream.
  o.recompute = Recompute::kNone;
  o.tp = 2;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, o), 32768 + (16384 + 8192 + 67584 + 1024) / 2.0);
}

TEST(ActivationMemory, FullRecomputeWorkingSetIsOneWholeLayer) {
  const ModelSpec m = model_preset("gpt2-124m");
  ActivationOptions o = paper_setting(1, 1024, 1);
  const double whole = layer_activation_bytes(m, o);
  EXPECT_EQ(recompute_working_bytes(m, o), 0.0);
  o.recompute = Recompute::kFull;
  EXPECT_DOUBLE_EQ(recompute_working_bytes(m, o), whole);
}

}  // namespace
}  // namespace lattice::plan
