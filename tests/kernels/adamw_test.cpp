// Fused AdamW against hand-computed steps and a double-precision reference.
#include "kernels/adamw.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/elementwise.h"
#include "op_registry.h"

namespace lattice {
namespace {

using optest::Buffer;

TEST(AdamW, TwoStepsByHandIncludingBiasCorrectionAndWeightDecay) {
  Arena arena("test");
  Tensor p = optest::make_tensor(arena, {1}, DType::kF32, {1.0});
  Tensor g = optest::make_tensor(arena, {1}, DType::kF32, {0.5});
  Tensor m = Tensor::zeros(arena, {1}, DType::kF32);
  Tensor v = Tensor::zeros(arena, {1}, DType::kF32);
  const AdamWHyper h{.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  // fp32 arithmetic (1 - β rounds, products round): a few ulp, 1e-6 relative.
  // Step 1: m = 0.05, v = 0.0125; bias correction gives m̂ = g, v̂ = g², so the step is
  // lr·(g/|g| + wd·p) = 0.1·(1 + 0.1): p = 0.89.
  adamw_update(p, g, m, v, h, 1);
  EXPECT_NEAR(optest::to_buffer(m)[0], 0.05, 0.05e-6);
  EXPECT_NEAR(optest::to_buffer(v)[0], 0.0125, 0.0125e-6);
  EXPECT_NEAR(optest::to_buffer(p)[0], 0.89, 1e-7);
  // Step 2 with g = -0.25: m = 0.02, v = 0.015, m̂ = 0.02/0.19, v̂ = 0.015/0.0975,
  // p = 0.89 - 0.1·(m̂/√v̂ + 0.1·0.89) = 0.854263058.
  g.data<float>()[0] = -0.25f;
  adamw_update(p, g, m, v, h, 2);
  EXPECT_NEAR(optest::to_buffer(m)[0], 0.02, 0.02e-6);
  EXPECT_NEAR(optest::to_buffer(v)[0], 0.015, 0.015e-6);
  EXPECT_NEAR(optest::to_buffer(p)[0], 0.854263058, 1e-6);
}

TEST(AdamW, FourStepsMatchADoublePrecisionReferenceAndWriteTheBf16Copy) {
  Arena arena("test");
  const int64_t n = 37;  // not a multiple of the vector width
  Buffer p0(size_t(n), 0.0), grads(size_t(n), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = double(float(0.1 * double(i % 11) - 0.5));
  }
  Tensor p = optest::make_tensor(arena, {n}, DType::kF32, p0);
  Tensor m = Tensor::zeros(arena, {n}, DType::kF32);
  Tensor v = Tensor::zeros(arena, {n}, DType::kF32);
  Tensor copy = Tensor::zeros(arena, {n}, DType::kBF16);
  const AdamWHyper h{
      .lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.05f};
  Buffer rp = p0, rm(size_t(n), 0.0), rv(size_t(n), 0.0);
  for (int64_t step = 1; step <= 4; ++step) {
    for (int64_t i = 0; i < n; ++i) grads[i] = double(float(std::sin(double(i * step)) * 0.3));
    Tensor g = optest::make_tensor(arena, {n}, DType::kF32, grads);
    adamw_update(p, g, m, v, h, step, copy);
    const double bc1 = 1.0 - std::pow(double(h.beta1), double(step));
    const double bc2 = 1.0 - std::pow(double(h.beta2), double(step));
    for (int64_t i = 0; i < n; ++i) {
      rm[i] = double(h.beta1) * rm[i] + (1.0 - double(h.beta1)) * grads[i];
      rv[i] = double(h.beta2) * rv[i] + (1.0 - double(h.beta2)) * grads[i] * grads[i];
      const double update = (rm[i] / bc1) / (std::sqrt(rv[i] / bc2) + double(h.eps));
      rp[i] -= double(h.lr) * (update + double(h.weight_decay) * rp[i]);
    }
    EXPECT_TRUE(optest::buffers_near(optest::to_buffer(m), rm, 1e-7, 1e-5, "m")) << step;
    EXPECT_TRUE(optest::buffers_near(optest::to_buffer(v), rv, 1e-9, 1e-5, "v")) << step;
    EXPECT_TRUE(optest::buffers_near(optest::to_buffer(p), rp, 1e-6, 1e-5, "param")) << step;
    EXPECT_EQ(optest::to_buffer(copy), optest::round_to_bf16(optest::to_buffer(p))) << step;
  }
}

TEST(AdamW, BadArgumentsRaiseErrorsNamingKernelAndArgument) {
  Arena arena("test");
  Tensor p = Tensor::zeros(arena, {8}, DType::kF32);
  Tensor g = Tensor::zeros(arena, {8}, DType::kF32);
  Tensor m = Tensor::zeros(arena, {8}, DType::kF32);
  Tensor v = Tensor::zeros(arena, {8}, DType::kF32);
  Tensor bf16_grad = Tensor::zeros(arena, {8}, DType::kBF16);
  Tensor short_m = Tensor::zeros(arena, {7}, DType::kF32);
  Tensor short_copy = Tensor::zeros(arena, {7}, DType::kBF16);
  const AdamWHyper h;
  try {
    adamw_update(p, g, m, v, h, 0);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("adamw_update: step"), std::string::npos) << e.what();
  }
  EXPECT_THROW(adamw_update(p, bf16_grad, m, v, h, 1), DTypeError);
  EXPECT_THROW(adamw_update(p, g, short_m, v, h, 1), ShapeError);
  EXPECT_THROW(adamw_update(p, g, m, v, h, 1, short_copy), ShapeError);
  EXPECT_THROW(adamw_update(p, Tensor(), m, v, h, 1), ValueError);
  AdamWHyper bad_beta;
  bad_beta.beta1 = 1.0f;
  EXPECT_THROW(adamw_update(p, g, m, v, bad_beta, 1), ValueError);
  AdamWHyper bad_eps;
  bad_eps.eps = 0.0f;
  EXPECT_THROW(adamw_update(p, g, m, v, bad_eps, 1), ValueError);
  for (const float bad : {0.0f, -0.5f, std::nanf(""), INFINITY}) {
    AdamWHyper bad_scale;
    bad_scale.grad_scale = bad;
    try {
      adamw_update(p, g, m, v, bad_scale, 1);
      FAIL() << "expected ValueError for grad_scale " << bad;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("grad_scale"), std::string::npos) << e.what();
    }
  }
}

// The clip factor folded into the update gives the same bits as scaling the gradients in a pass
// of their own first, and it is not a no-op: the moments see the scaled gradients.
TEST(AdamW, GradScaleIsBitwiseTheUpdateFromPreScaledGradients) {
  Arena arena("test");
  const int64_t n = 53;
  Buffer p0(static_cast<size_t>(n)), g0(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    p0[size_t(i)] = double(float(0.07 * double(i % 13) - 0.4));
    g0[size_t(i)] = double(float(std::cos(double(i) * 0.7) * 2.5));
  }
  const float factor = 0.3183099f;
  AdamWHyper fused{.lr = 0.02f, .weight_decay = 0.1f};
  fused.grad_scale = factor;
  AdamWHyper plain = fused;
  plain.grad_scale = 1.0f;
  Tensor p_fused = optest::make_tensor(arena, {n}, DType::kF32, p0);
  Tensor p_plain = optest::make_tensor(arena, {n}, DType::kF32, p0);
  Tensor m_fused = Tensor::zeros(arena, {n}, DType::kF32),
         v_fused = Tensor::zeros(arena, {n}, DType::kF32);
  Tensor m_plain = Tensor::zeros(arena, {n}, DType::kF32),
         v_plain = Tensor::zeros(arena, {n}, DType::kF32);
  Tensor copy_fused = Tensor::zeros(arena, {n}, DType::kBF16);
  Tensor copy_plain = Tensor::zeros(arena, {n}, DType::kBF16);
  for (int64_t step = 1; step <= 3; ++step) {
    const Tensor g = optest::make_tensor(arena, {n}, DType::kF32, g0);
    Tensor pre_scaled = optest::make_tensor(arena, {n}, DType::kF32, g0);
    scale(pre_scaled, factor);
    adamw_update(p_fused, g, m_fused, v_fused, fused, step, copy_fused);
    adamw_update(p_plain, pre_scaled, m_plain, v_plain, plain, step, copy_plain);
    EXPECT_EQ(optest::to_buffer(g), g0) << "the gradients are read, not scaled in place";
    EXPECT_EQ(optest::to_buffer(m_fused), optest::to_buffer(m_plain)) << step;
    EXPECT_EQ(optest::to_buffer(v_fused), optest::to_buffer(v_plain)) << step;
    EXPECT_EQ(optest::to_buffer(p_fused), optest::to_buffer(p_plain)) << step;
    EXPECT_EQ(optest::to_buffer(copy_fused), optest::to_buffer(copy_plain)) << step;
  }
  // m after one step is (1-β1)·g·factor: the scale reached the moments.
  Tensor m_once = Tensor::zeros(arena, {n}, DType::kF32),
         v_once = Tensor::zeros(arena, {n}, DType::kF32);
  Tensor p_once = optest::make_tensor(arena, {n}, DType::kF32, p0);
  adamw_update(p_once, optest::make_tensor(arena, {n}, DType::kF32, g0), m_once, v_once, fused, 1);
  EXPECT_NEAR(optest::to_buffer(m_once)[1], (1.0 - 0.9) * g0[1] * double(factor), 1e-6);
}

}  // namespace
}  // namespace lattice
