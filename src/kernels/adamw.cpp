// Fused AdamW: one pass reads grad, m, v and the fp32 master weight and writes m, v, the weight
// and (optionally) its compute copy. Bias corrections are formed in double once per call.
#include "kernels/adamw.h"

#include <cmath>
#include <type_traits>

#include "kernels/kernel_support.h"

namespace lattice {

using kernel::Elem;
using kernel::store_as;
using kernel::visit_floats;

namespace {

void expect_hyper(const AdamWHyper& h, int64_t step, std::string_view op) {
  if (step < 1) {
    LATTICE_THROW(ValueError, "{}: step must count from 1 (bias correction), got {}", op, step);
  }
  if (!(h.lr >= 0.0f) || !std::isfinite(h.lr)) {
    LATTICE_THROW(ValueError, "{}: lr must be finite and >= 0, got {}", op, h.lr);
  }
  if (!(h.beta1 >= 0.0f && h.beta1 < 1.0f) || !(h.beta2 >= 0.0f && h.beta2 < 1.0f)) {
    LATTICE_THROW(ValueError, "{}: betas must lie in [0, 1), got beta1={} beta2={}", op, h.beta1,
                  h.beta2);
  }
  if (!(h.eps > 0.0f)) LATTICE_THROW(ValueError, "{}: eps must be > 0, got {}", op, h.eps);
  if (!(h.weight_decay >= 0.0f) || !std::isfinite(h.weight_decay)) {
    LATTICE_THROW(ValueError, "{}: weight_decay must be finite and >= 0, got {}", op,
                  h.weight_decay);
  }
  if (!(h.grad_scale > 0.0f) || !std::isfinite(h.grad_scale)) {
    LATTICE_THROW(ValueError, "{}: grad_scale must be finite and > 0, got {}", op, h.grad_scale);
  }
}

// The update with p_copy receiving the new weight; Copy is float or bf16, or void for none.
template <class Copy>
void adamw_loop(float* p, const float* g, float* m, float* v, Copy* p_copy, int64_t n,
                const AdamWHyper& h, float inv_bc1, float inv_bc2) {
  const float beta1 = h.beta1;
  const float beta2 = h.beta2;
  const float one_minus_beta1 = 1.0f - beta1;
  const float one_minus_beta2 = 1.0f - beta2;
  const float lr = h.lr;
  const float eps = h.eps;
  const float wd = h.weight_decay;
  const float grad_scale = h.grad_scale;
  LATTICE_PARALLEL_FOR(n)
  for (int64_t i = 0; i < n; ++i) {
    // The product a separate scale pass would have stored: the same bits, one sweep fewer.
    const float gi = grad_scale * g[i];
    const float mi = beta1 * m[i] + one_minus_beta1 * gi;
    const float vi = beta2 * v[i] + one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi * inv_bc1;
    const float v_hat = vi * inv_bc2;
    const float pi = p[i] - lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * p[i]);
    p[i] = pi;
    if constexpr (!std::is_void_v<Copy>) p_copy[i] = store_as<Copy>(pi);
  }
}

}  // namespace

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& hyper,
                  int64_t step, Tensor param_copy) {
  const KernelTimer timer("adamw", 0, kernel::bytes_of({&param, &grad, &m, &v, &param_copy}));
  constexpr std::string_view kOp = "adamw_update";
  expect_dtype(param, DType::kF32, kOp, "param");
  expect_dtype(grad, DType::kF32, kOp, "grad");
  expect_dtype(m, DType::kF32, kOp, "m");
  expect_dtype(v, DType::kF32, kOp, "v");
  expect_same_shape(grad, param, kOp, "grad", "param");
  expect_same_shape(m, param, kOp, "m", "param");
  expect_same_shape(v, param, kOp, "v", "param");
  if (param_copy.defined()) {
    expect_float_dtype(param_copy, kOp, "param_copy");
    expect_same_shape(param_copy, param, kOp, "param_copy", "param");
  }
  expect_hyper(hyper, step, kOp);

  const float inv_bc1 = float(1.0 / (1.0 - std::pow(double(hyper.beta1), double(step))));
  const float inv_bc2 = float(1.0 / (1.0 - std::pow(double(hyper.beta2), double(step))));
  const int64_t n = param.numel();
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  if (!param_copy.defined()) {
    adamw_loop<void>(p, g, pm, pv, nullptr, n, hyper, inv_bc1, inv_bc2);
    return;
  }
  visit_floats(
      [&](auto* copy) {
        adamw_loop<Elem<decltype(copy)>>(p, g, pm, pv, copy, n, hyper, inv_bc1, inv_bc2);
      },
      param_copy);
}

}  // namespace lattice
