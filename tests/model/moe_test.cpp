// Mixture of experts: the router against hand-checked numbers and its gradient against finite
// differences, and the whole sparse model's gradient against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/philox.h"
#include "model/moe_router.h"
#include "model/transformer.h"
#include "tiny_batch.h"

namespace lattice {
namespace {

ModelConfig router_config(int64_t experts, int64_t k) {
  ModelConfig c = model_preset("mixtral-tiny");
  c.n_experts = experts;
  c.experts_per_token = k;
  c.moe_aux_loss = 0.5f;
  c.moe_z_loss = 0.25f;
  return c;
}

// Two tokens of one sequence, two experts, top-1: both pick expert 0, so f = (1, 0) and
// P_0 = (σ(2) + σ(1)) / 2 = (0.880797 + 0.731059) / 2 = 0.805928; balance = E · f·P =
// 1.611856; the sum over the sequence is coef · T · balance = 0.5 · 2 · 1.611856. The z-loss:
// lse = 2 + ln(1 + e⁻²) = 2.126928 and 1 + ln(1 + e⁻¹) = 1.313262, 0.25 · (4.523823 + 1.724657).
TEST(MoeRouter, LossesMatchTheirFormulasOnAHandCheckedCase) {
  const ModelConfig c = router_config(2, 1);
  const std::vector<float> logits = {2, 0, 1, 0};
  std::vector<float> probs(4), lse(2);
  Routing r;
  route_tokens(c, logits.data(), 2, 2, r, probs.data(), lse.data());
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(r.gate, (std::vector<float>{1.0f, 1.0f}));  // top-1: the softmax over one logit
  EXPECT_EQ(r.chosen, (std::vector<int64_t>{2, 0}));
  EXPECT_NEAR(probs[0], 0.880797, 1e-6);
  EXPECT_NEAR(lse[0], 2.126928, 1e-6);
  EXPECT_NEAR(lse[1], 1.313262, 1e-6);
  const double expected = 0.5 * 2 * 1.611856 + 0.25 * (4.523823 + 1.724657);
  EXPECT_NEAR(router_loss_sum(c, r, probs.data(), lse.data(), 2), expected, 1e-5);
  // Balanced routing: f = P = (1/2, 1/2), balance exactly 1.
  ModelConfig balanced = c;
  balanced.moe_z_loss = 0.0f;
  const std::vector<float> even = {1, 0, 0, 1};
  route_tokens(balanced, even.data(), 2, 2, r, probs.data(), lse.data());
  EXPECT_NEAR(router_loss_sum(balanced, r, probs.data(), lse.data(), 2), 0.5 * 2 * 1.0, 1e-6);
}

// Top-2 of 3: the gates are the softmax over the two chosen logits; packed rows are expert-major
// in token order.
TEST(MoeRouter, TopTwoGatesAndPackedRows) {
  const ModelConfig c = router_config(3, 2);
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f,   // token 0: experts 1, 2
                                     3.0f, 0.0f, 3.0f};  // token 1: a tie, 0 before 2
  std::vector<float> probs(6), lse(2);
  Routing r;
  route_tokens(c, logits.data(), 2, 2, r, probs.data(), lse.data());
  EXPECT_EQ(r.expert, (std::vector<int32_t>{1, 2, 0, 2}));
  EXPECT_NEAR(r.gate[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(r.gate[2], 0.5, 1e-7);
  EXPECT_EQ(r.expert_begin, (std::vector<int64_t>{0, 1, 2, 4}));
  EXPECT_EQ(r.token_of_row, (std::vector<int32_t>{1, 0, 0, 1}));
  EXPECT_EQ(r.row, (std::vector<int32_t>{1, 2, 0, 3}));
}

// Capacity 1 · T · k / E = 2 for four tokens that all want expert 0: positions 2 and 3 are
// dropped (row -1) and carry no expert output.
TEST(MoeRouter, CapacityDropsTheLaterPositions) {
  ModelConfig c = router_config(2, 1);
  c.capacity_factor = 1.0f;
  const std::vector<float> logits = {1, 0, 2, 0, 3, 0, 4, 0};
  std::vector<float> probs(8), lse(4);
  Routing r;
  route_tokens(c, logits.data(), 4, 4, r, probs.data(), lse.data());
  EXPECT_EQ(r.row, (std::vector<int32_t>{0, 1, -1, -1}));
  EXPECT_EQ(r.dropped, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(r.rows(), 2);
}

// dlogits of L = Σ_i c_i · gate_i + scale · router losses, against central differences with the
// routing held (no logit crosses another).
TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  const ModelConfig c = router_config(4, 2);
  const int64_t tokens = 6, T = 3, E = 4, k = 2;
  std::vector<float> logits(static_cast<size_t>(tokens * E));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(int(i * 7 % 11)) * 0.37f - 1.5f;
  std::vector<float> weights(static_cast<size_t>(tokens * k));
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = float(int(i * 5 % 7)) * 0.3f - 0.8f;
  const float scale = 0.7f;
  auto objective = [&](const std::vector<float>& l, Routing& r) {
    std::vector<float> probs(size_t(tokens * E)), lse(static_cast<size_t>(tokens));
    route_tokens(c, l.data(), tokens, T, r, probs.data(), lse.data());
    double sum = scale * router_loss_sum(c, r, probs.data(), lse.data(), T);
    for (size_t i = 0; i < weights.size(); ++i) sum += double(weights[i]) * r.gate[i];
    return sum;
  };
  Routing r;
  objective(logits, r);
  std::vector<float> probs(size_t(tokens * E)), lse(static_cast<size_t>(tokens)),
      dlogits(size_t(tokens * E));
  route_tokens(c, logits.data(), tokens, T, r, probs.data(), lse.data());
  router_backward(c, r, probs.data(), lse.data(), weights.data(), T, scale, dlogits.data());
  const float h = 1e-3f;
  for (size_t i = 0; i < logits.size(); ++i) {
    std::vector<float> plus = logits, minus = logits;
    plus[i] += h;
    minus[i] -= h;
    Routing rp, rm;
    const double numeric = (objective(plus, rp) - objective(minus, rm)) / (2.0 * h);
    ASSERT_EQ(rp.expert, r.expert) << "a step of " << h << " changed the routing";
    ASSERT_EQ(rm.expert, r.expert);
    EXPECT_NEAR(dlogits[i], numeric, 1e-3 + 1e-2 * std::abs(numeric)) << "logit " << i;
  }
}

using Batch = testing::TinyBatch;
using testing::make_tiny_batch;

ModelConfig tiny_moe(MlpKind mlp, float capacity_factor) {
  ModelConfig c = model_preset("mixtral-tiny");
  c.vocab_size = 11;
  c.d_model = 16;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_ff = 12;
  c.seq_len = 8;
  c.n_experts = 4;
  c.experts_per_token = 2;
  c.moe_aux_loss = 0.3f;
  c.moe_z_loss = 0.1f;
  c.capacity_factor = capacity_factor;
  c.mlp = mlp;
  c.init_std = 0.2f;
  return c;
}

// The objective trained on: token losses plus the router losses, over the token count.
double objective(Transformer& model, Batch& batch) {
  ForwardResult r = model.forward(batch.tokens_t(), batch.targets_t());
  return (r.loss_sum + r.router_loss_sum) / double(r.token_count);
}

std::vector<int32_t> experts_chosen(const Transformer& model) {
  std::vector<int32_t> all;
  for (int64_t l = 0; l < model.config().n_layer; ++l) {
    const Routing* r = model.routing(l);
    all.insert(all.end(), r->expert.begin(), r->expert.end());
    all.insert(all.end(), r->row.begin(), r->row.end());
  }
  return all;
}

struct MoeCase {
  const char* name;
  MlpKind mlp;
  float capacity_factor;
};

class MoeGradient : public ::testing::TestWithParam<MoeCase> {};

// Router, experts and every other parameter against central differences. A step that changes
// some token's choice of experts makes the loss jump; such samples are skipped, and at least
// most samples must be smooth.
TEST_P(MoeGradient, MatchesFiniteDifferences) {
  Arena arena("test");
  Transformer model(tiny_moe(GetParam().mlp, GetParam().capacity_factor), arena, DType::kF32);
  model.initialize(7);
  Batch batch = make_tiny_batch(model.config().vocab_size);
  ParameterStore& store = model.parameters();
  store.zero_grads();
  ForwardResult r = model.forward(batch.tokens_t(), batch.targets_t());
  ASSERT_GT(r.router_loss_sum, 0.0);
  const std::vector<int32_t> routing = experts_chosen(model);
  model.backward(float(1.0 / double(r.token_count)));
  std::vector<float> grads(store.grads().data<float>(),
                           store.grads().data<float>() + store.grads().numel());
  const float h = 2e-3f;
  float* w = store.master().data<float>();
  PhiloxStream pick(11, 12);
  int smooth = 0, samples = 0, router_checked = 0, experts_checked = 0;
  for (const ParameterSpec& spec : model.registry().specs()) {
    for (int sample = 0; sample < 4; ++sample) {
      ++samples;
      const int64_t i = spec.offset + int64_t(pick.next_below(uint64_t(spec.shape.numel())));
      const float saved = w[i];
      w[i] = saved + h;
      const double plus = objective(model, batch);
      const bool plus_same = experts_chosen(model) == routing;
      w[i] = saved - h;
      const double minus = objective(model, batch);
      const bool minus_same = experts_chosen(model) == routing;
      w[i] = saved;
      if (!plus_same || !minus_same) continue;
      ++smooth;
      if (spec.name.find(".gate.weight") != std::string::npos) ++router_checked;
      if (spec.name.find(".experts.") != std::string::npos) ++experts_checked;
      const double numeric = (plus - minus) / (2.0 * h);
      EXPECT_NEAR(grads[size_t(i)], numeric, 3e-4 + 3e-2 * std::abs(numeric))
          << spec.name << " element " << i - spec.offset;
    }
  }
  EXPECT_GE(smooth, samples * 3 / 4);
  EXPECT_GE(router_checked, 4);
  EXPECT_GE(experts_checked, 40);
}

INSTANTIATE_TEST_SUITE_P(Experts, MoeGradient,
                         ::testing::Values(MoeCase{"swiglu", MlpKind::kSwiglu, 0.0f},
                                           MoeCase{"gelu", MlpKind::kGelu, 0.0f},
                                           MoeCase{"swiglu_capacity", MlpKind::kSwiglu, 0.75f}),
                         [](const auto& info) { return std::string(info.param.name); });

// Turning the router losses off changes the router's gradient: the loss terms are really in
// the backward (a test that would pass without them is no test of them).
TEST(MoeRouterLosses, ReachTheRoutersGradient) {
  auto router_grad = [](float aux, float z) {
    ModelConfig c = tiny_moe(MlpKind::kSwiglu, 0.0f);
    c.moe_aux_loss = aux;
    c.moe_z_loss = z;
    Arena arena("test");
    Transformer model(c, arena, DType::kF32);
    model.initialize(7);
    Batch batch = make_tiny_batch(c.vocab_size);
    model.parameters().zero_grads();
    ForwardResult r = model.forward(batch.tokens_t(), batch.targets_t());
    model.backward(float(1.0 / double(r.token_count)));
    const int index = model.registry().find("model.layers.0.block_sparse_moe.gate.weight");
    const Tensor g = model.parameters().grad(index);
    return std::vector<float>(g.data<float>(), g.data<float>() + g.numel());
  };
  const std::vector<float> none = router_grad(0.0f, 0.0f);
  EXPECT_NE(router_grad(0.3f, 0.0f), none);
  EXPECT_NE(router_grad(0.0f, 0.1f), none);
}

}  // namespace
}  // namespace lattice
