// GELU (tanh form, Hendrycks & Gimpel 2016) and SwiGLU (Shazeer 2020), pointwise.
//
// GELU is evaluated through the identity 0.5·(1 + tanh(u)) = sigmoid(2u), so one exp per
// element serves both directions: gelu(x) = x·s with s = sigmoid(2u), u = √(2/π)(x + 0.044715x³),
// and gelu'(x) = s + x·2s(1-s)·u'(x) because d/du sigmoid(2u) = 2s(1-s).
#include "kernels/activations.h"

#include "kernels/kernel_support.h"

namespace lattice {

using kernel::Elem;
using kernel::load;
using kernel::sigmoid_fast;
using kernel::store_as;
using kernel::visit_floats;

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

}  // namespace

void gelu_forward(Tensor& out, const Tensor& inp) {
  const KernelTimer timer("gelu fwd", 0, kernel::bytes_of({&out, &inp}));
  constexpr std::string_view kOp = "gelu_forward";
  expect_float_dtype(out, kOp, "out");
  expect_float_dtype(inp, kOp, "inp");
  expect_same_shape(out, inp, kOp, "out", "inp");
  const int64_t n = inp.numel();
  visit_floats(
      [n](auto* o, auto* x) {
        using O = Elem<decltype(o)>;
        LATTICE_PARALLEL_FOR(n)
        for (int64_t i = 0; i < n; ++i) {
          float v = load(x[i]);
          float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
          o[i] = store_as<O>(v * sigmoid_fast(2.0f * u));
        }
      },
      out, inp);
}

void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  const KernelTimer timer("gelu bwd", 0, kernel::bytes_of({&dinp, &dout, &inp}));
  constexpr std::string_view kOp = "gelu_backward";
  expect_float_dtype(dinp, kOp, "dinp");
  expect_float_dtype(dout, kOp, "dout");
  expect_float_dtype(inp, kOp, "inp");
  expect_same_shape(dinp, inp, kOp, "dinp", "inp");
  expect_same_shape(dout, inp, kOp, "dout", "inp");
  const int64_t n = inp.numel();
  visit_floats(
      [n](auto* dx, auto* dy, auto* x) {
        using DX = Elem<decltype(dx)>;
        LATTICE_PARALLEL_FOR(n)
        for (int64_t i = 0; i < n; ++i) {
          float v = load(x[i]);
          float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
          float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
          float s = sigmoid_fast(2.0f * u);
          float local = s + v * 2.0f * s * (1.0f - s) * du;
          dx[i] = store_as<DX>(load(dx[i]) + load(dy[i]) * local);
        }
      },
      dinp, dout, inp);
}

void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  const KernelTimer timer("swiglu fwd", 0, kernel::bytes_of({&out, &gate, &up}));
  constexpr std::string_view kOp = "swiglu_forward";
  expect_float_dtype(out, kOp, "out");
  expect_float_dtype(gate, kOp, "gate");
  expect_float_dtype(up, kOp, "up");
  expect_same_shape(gate, up, kOp, "gate", "up");
  expect_same_shape(out, gate, kOp, "out", "gate");
  const int64_t n = gate.numel();
  visit_floats(
      [n](auto* o, auto* g, auto* u) {
        using O = Elem<decltype(o)>;
        LATTICE_PARALLEL_FOR(n)
        for (int64_t i = 0; i < n; ++i) {
          float gv = load(g[i]);
          o[i] = store_as<O>(gv * sigmoid_fast(gv) * load(u[i]));
        }
      },
      out, gate, up);
}

void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  const KernelTimer timer("swiglu bwd", 0, kernel::bytes_of({&dgate, &dup, &dout, &gate, &up}));
  constexpr std::string_view kOp = "swiglu_backward";
  expect_float_dtype(dgate, kOp, "dgate");
  expect_float_dtype(dup, kOp, "dup");
  expect_float_dtype(dout, kOp, "dout");
  expect_float_dtype(gate, kOp, "gate");
  expect_float_dtype(up, kOp, "up");
  expect_same_shape(gate, up, kOp, "gate", "up");
  expect_same_shape(dgate, gate, kOp, "dgate", "gate");
  expect_same_shape(dup, gate, kOp, "dup", "gate");
  expect_same_shape(dout, gate, kOp, "dout", "gate");
  const int64_t n = gate.numel();
  visit_floats(
      [n](auto* dg, auto* du, auto* dy, auto* g, auto* u) {
        using DG = Elem<decltype(dg)>;
        using DU = Elem<decltype(du)>;
        LATTICE_PARALLEL_FOR(n)
        for (int64_t i = 0; i < n; ++i) {
          float gv = load(g[i]);
          float s = sigmoid_fast(gv);
          float silu = gv * s;
          float dsilu = s * (1.0f + gv * (1.0f - s));  // d/dg g·σ(g)
          float d = load(dy[i]);
          dg[i] = store_as<DG>(load(dg[i]) + d * load(u[i]) * dsilu);
          du[i] = store_as<DU>(load(du[i]) + d * silu);
        }
      },
      dgate, dup, dout, gate, up);
}

}  // namespace lattice
