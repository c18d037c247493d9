// Training on one fixed batch drives the loss near zero: forward, backward and the optimizer
// are wired together correctly, for both families and both precisions.
#include <gtest/gtest.h>

#include "core/philox.h"
#include "kernels/adamw.h"
#include "model/transformer.h"

namespace lattice {
namespace {

struct Case {
  const char* preset;
  DType dtype;
};

class Overfit : public ::testing::TestWithParam<Case> {};

TEST_P(Overfit, OneBatchLossGoesNearZero) {
  Arena arena("test");
  ModelConfig config = model_preset(GetParam().preset);
  config.seq_len = 16;
  Transformer model(config, arena, GetParam().dtype);
  model.initialize(1);
  std::vector<int32_t> tokens(64), targets(64);
  PhiloxStream rng(1, 2);
  for (int i = 0; i < 64; ++i) {
    tokens[size_t(i)] = int32_t(rng.next_below(256));
    targets[size_t(i)] = int32_t(rng.next_below(256));
  }
  Tensor in = Tensor::borrow(tokens.data(), {4, 16}, DType::kI32);
  Tensor out = Tensor::borrow(targets.data(), {4, 16}, DType::kI32);
  ParameterStore& store = model.parameters();
  Tensor m = Tensor::zeros(arena, store.master().shape(), DType::kF32);
  Tensor v = Tensor::zeros(arena, store.master().shape(), DType::kF32);
  AdamWHyper hyper{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.0f};
  double first = 0.0, last = 0.0;
  for (int step = 1; step <= 150; ++step) {
    store.zero_grads();
    ForwardResult r = model.forward(in, out);
    model.backward(float(1.0 / double(r.token_count)));
    Tensor copy = GetParam().dtype == DType::kF32 ? Tensor() : store.compute();
    adamw_update(store.master(), store.grads(), m, v, hyper, step, copy);
    last = r.loss_sum / double(r.token_count);
    if (step == 1) first = last;
  }
  EXPECT_NEAR(first, std::log(256.0), 0.3);
  EXPECT_LT(last, 0.05) << "from " << first;
}

INSTANTIATE_TEST_SUITE_P(Models, Overfit,
                         ::testing::Values(Case{"gpt2-tiny", DType::kF32},
                                           Case{"llama-tiny", DType::kF32},
                                           Case{"gpt2-tiny", DType::kBF16},
                                           Case{"llama-tiny", DType::kBF16}),
                         [](const auto& info) {
                           std::string name = info.param.preset;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name + "_" + std::string(dtype_name(info.param.dtype));
                         });

}  // namespace
}  // namespace lattice
