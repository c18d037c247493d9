// The whole model's gradient against finite differences, for both families on tiny configs, in
// every GEMM library the build has (oneDNN; oneMKL where setup unpacked it).
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "core/philox.h"
#include "kernels/matmul.h"
#include "model/transformer.h"
#include "tiny_batch.h"

namespace lattice {
namespace {

ModelConfig tiny(ModelFamily family) {
  ModelConfig c =
      family == ModelFamily::kGpt2 ? model_preset("gpt2-tiny") : model_preset("llama-tiny");
  c.vocab_size = 11;
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 4;
  c.n_kv_head = family == ModelFamily::kGpt2 ? 4 : 2;
  c.d_ff = family == ModelFamily::kGpt2 ? 32 : 24;
  c.seq_len = 8;
  c.init_std = 0.2f;  // large enough weights that every path carries gradient
  return c;
}

using Batch = testing::TinyBatch;
using testing::make_tiny_batch;

double loss_of(Transformer& model, Batch& batch) {
  ForwardResult r = model.forward(batch.tokens_t(), batch.targets_t());
  return r.loss_sum / double(r.token_count);
}

class TransformerGradient : public ::testing::TestWithParam<std::tuple<ModelFamily, GemmLibrary>> {
 protected:
  void SetUp() override { set_gemm_library(std::get<1>(GetParam())); }
  void TearDown() override { set_gemm_library(GemmLibrary::kOneDnn); }
};

TEST_P(TransformerGradient, MatchesFiniteDifferences) {
  Arena arena("test");
  Transformer model(tiny(std::get<0>(GetParam())), arena, DType::kF32);
  model.initialize(7);
  Batch batch = make_tiny_batch(model.config().vocab_size);
  ParameterStore& store = model.parameters();

  store.zero_grads();
  ForwardResult r = model.forward(batch.tokens_t(), batch.targets_t());
  model.backward(float(1.0 / double(r.token_count)));
  std::vector<float> grads(store.grads().data<float>(),
                           store.grads().data<float>() + store.grads().numel());

  // Per element: a few entries of every parameter, central differences in fp32 with a step
  // large enough that rounding of the loss (~1e-7) stays far below the tolerance.
  const float h = 1e-2f;
  float* w = store.master().data<float>();
  PhiloxStream pick(11, 12);
  for (const ParameterSpec& spec : model.registry().specs()) {
    for (int sample = 0; sample < 4; ++sample) {
      int64_t i = spec.offset + int64_t(pick.next_below(uint64_t(spec.shape.numel())));
      const float saved = w[i];
      w[i] = saved + h;
      double plus = loss_of(model, batch);
      w[i] = saved - h;
      double minus = loss_of(model, batch);
      w[i] = saved;
      double numeric = (plus - minus) / (2.0 * h);
      double analytic = grads[size_t(i)];
      EXPECT_NEAR(analytic, numeric, 2e-4 + 3e-2 * std::abs(numeric))
          << spec.name << " element " << i - spec.offset;
    }
  }

  // Along a random direction through all parameters at once: dL/dt = g·d.
  const int64_t P = store.master().numel();
  std::vector<float> direction(static_cast<size_t>(P));
  std::vector<float> saved(w, w + P);
  fill_normal(direction.data(), P, 5, 6, 0, 0.0f, 1.0f);
  double g_dot_d = 0.0;
  for (int64_t i = 0; i < P; ++i) g_dot_d += double(grads[size_t(i)]) * direction[size_t(i)];
  const float t = 1e-3f;
  for (int64_t i = 0; i < P; ++i) w[i] = saved[size_t(i)] + t * direction[size_t(i)];
  double plus = loss_of(model, batch);
  for (int64_t i = 0; i < P; ++i) w[i] = saved[size_t(i)] - t * direction[size_t(i)];
  double minus = loss_of(model, batch);
  EXPECT_NEAR((plus - minus) / (2.0 * t), g_dot_d, 1e-2 * std::abs(g_dot_d) + 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Families, TransformerGradient,
                         ::testing::Combine(::testing::Values(ModelFamily::kGpt2,
                                                              ModelFamily::kLlama),
                                            ::testing::ValuesIn(available_gemm_libraries())),
                         [](const auto& info) {
                           return std::string(family_name(std::get<0>(info.param))) + "_" +
                                  std::string(gemm_library_key(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace lattice
