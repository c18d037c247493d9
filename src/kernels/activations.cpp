// GELU (tanh form, Hendrycks & Gimpel 2016) and SwiGLU (Shazeer 2020), pointwise.
//
// GELU is evaluated through the identity 0.5·(1 + tanh(u)) = sigmoid(2u), so one exp per
// element serves both directions: gelu(x) = x·s with s = sigmoid(2u), u = √(2/π)(x + 0.044715x³),
// and gelu'(x) = s + x·2s(1-s)·u'(x) because d/du sigmoid(2u) = 2s(1-s).
//
// Each kernel's arithmetic is written once, as a function of its loads. On f32 tensors it runs
// on 16-float vectors (kernels/simd.h: the compiler's own vectorisation of exp_fast builds 2^n
// in eight integer operations, VSCALEFPS in one) and on scalars for the last n % 16 elements;
// the two give the same bits, so the split does not show in the results.
#include "kernels/activations.h"

#include <type_traits>

#include "kernels/kernel_support.h"
#include "kernels/simd.h"

namespace lattice {

using kernel::kVecLanes;
using kernel::load;
using kernel::load_vec;
using kernel::sigmoid_fast;
using kernel::sigmoid_vec;
using kernel::store_as;
using kernel::store_vec;
using kernel::Vec;
using kernel::visit_floats;

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

float sigmoid_of(float x) {
  return sigmoid_fast(x);
}
Vec sigmoid_of(Vec x) {
  return sigmoid_vec(x);
}

// Element access of the plain loop: a float at element i of an f32 or bf16 array.
struct ScalarAccess {
  template <class T>
  static float load_at(const T* p, int64_t i) {
    return load(p[i]);
  }
  template <class T>
  static void store_at(T* p, int64_t i, float v) {
    p[i] = store_as<T>(v);
  }
  static float zero() { return 0.0f; }
};
// ... and of the vector body: 16 of them from element i on, f32 only.
struct VectorAccess {
  static Vec load_at(const float* p, int64_t i) { return load_vec(p + i); }
  static void store_at(float* p, int64_t i, Vec v) { store_vec(p + i, v); }
  static Vec zero() { return Vec{}; }
};

// Every operand f32: with bf16 operands the plain loop (which the compiler vectorises its own
// way) measured faster than rounding to bf16 bit for bit with integer vector operations (AMD
// Zen 4, GELU on 393,216 elements: bf16 273 µs plain, 281 µs on vectors; f32 232 → 192 µs).
template <class... Pointers>
inline constexpr bool kAllF32 =
    (std::is_same_v<std::remove_const_t<std::remove_pointer_t<Pointers>>, float> && ...);

// What a backward adds its gradient to: the element already there, or 0 when it writes (0 +
// the gradient rounds as adding into zeros does). A compile-time choice: a branch inside the
// loop kept the compiler from vectorising the plain (bf16) loop, 10× slower on GPT-2's MLP.
template <class Access, class T>
auto prior_at(std::bool_constant<true>, Access access, const T* p, int64_t i) {
  return access.load_at(p, i);
}
template <class Access, class T>
auto prior_at(std::bool_constant<false>, Access access, const T*, int64_t) {
  return access.zero();
}

// f(std::true_type) to accumulate, f(std::false_type) to write.
template <class F>
void with_accumulate(bool accumulate, F&& f) {
  if (accumulate) {
    f(std::true_type());
  } else {
    f(std::false_type());
  }
}

// body(i, access) over n elements, split over the rank thread's budget: with Vectorise blocks
// of 16, then the last n % 16 on scalars; otherwise the plain loop throughout. Bodies capture their
// pointers by value: a store through one could otherwise alias the captured variables and every
// iteration would reload them.
template <bool Vectorise, class Body>
void for_each_element(int64_t n, Body&& body) {
  if constexpr (Vectorise) {
    const int64_t blocks = n / kVecLanes;
    LATTICE_PARALLEL_FOR(n)
    for (int64_t block = 0; block < blocks; ++block) body(block * kVecLanes, VectorAccess());
    for (int64_t i = blocks * kVecLanes; i < n; ++i) body(i, ScalarAccess());
  } else {
    LATTICE_PARALLEL_FOR(n)
    for (int64_t i = 0; i < n; ++i) body(i, ScalarAccess());
  }
}

}  // namespace

void gelu_forward(Tensor& out, const Tensor& inp) {
  const KernelTimer timer("gelu fwd", 0, kernel::bytes_of({&out, &inp}));
  constexpr std::string_view kOp = "gelu_forward";
  expect_float_dtype(out, kOp, "out");
  expect_float_dtype(inp, kOp, "inp");
  expect_same_shape(out, inp, kOp, "out", "inp");
  visit_floats(
      [&](auto* o, auto* x) {
        for_each_element<kAllF32<decltype(o), decltype(x)>>(
            inp.numel(), [o, x](int64_t i, auto access) {
              const auto v = access.load_at(x, i);
              const auto u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
              access.store_at(o, i, v * sigmoid_of(2.0f * u));
            });
      },
      out, inp);
}

void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp, bool accumulate) {
  const KernelTimer timer("gelu bwd", 0, kernel::bytes_of({&dinp, &dout, &inp}));
  constexpr std::string_view kOp = "gelu_backward";
  expect_float_dtype(dinp, kOp, "dinp");
  expect_float_dtype(dout, kOp, "dout");
  expect_float_dtype(inp, kOp, "inp");
  expect_same_shape(dinp, inp, kOp, "dinp", "inp");
  expect_same_shape(dout, inp, kOp, "dout", "inp");
  with_accumulate(accumulate, [&](auto adds) {
    visit_floats(
        [&](auto* dx, auto* dy, auto* x) {
          for_each_element<kAllF32<decltype(dx), decltype(dy), decltype(x)>>(
              inp.numel(), [dx, dy, x, adds](int64_t i, auto access) {
                const auto v = access.load_at(x, i);
                const auto u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
                const auto du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
                const auto s = sigmoid_of(2.0f * u);
                const auto local = s + v * 2.0f * s * (1.0f - s) * du;
                access.store_at(dx, i,
                                prior_at(adds, access, dx, i) + access.load_at(dy, i) * local);
              });
        },
        dinp, dout, inp);
  });
}

void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  const KernelTimer timer("swiglu fwd", 0, kernel::bytes_of({&out, &gate, &up}));
  constexpr std::string_view kOp = "swiglu_forward";
  expect_float_dtype(out, kOp, "out");
  expect_float_dtype(gate, kOp, "gate");
  expect_float_dtype(up, kOp, "up");
  expect_same_shape(gate, up, kOp, "gate", "up");
  expect_same_shape(out, gate, kOp, "out", "gate");
  visit_floats(
      [&](auto* o, auto* g, auto* u) {
        for_each_element<kAllF32<decltype(o), decltype(g), decltype(u)>>(
            gate.numel(), [o, g, u](int64_t i, auto access) {
              const auto gv = access.load_at(g, i);
              access.store_at(o, i, gv * sigmoid_of(gv) * access.load_at(u, i));
            });
      },
      out, gate, up);
}

void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up, bool accumulate) {
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
  with_accumulate(accumulate, [&](auto adds) {
    visit_floats(
        [&](auto* dg, auto* du, auto* dy, auto* g, auto* u) {
          for_each_element<
              kAllF32<decltype(dg), decltype(du), decltype(dy), decltype(g), decltype(u)>>(
              gate.numel(), [dg, du, dy, g, u, adds](int64_t i, auto access) {
                const auto gv = access.load_at(g, i);
                const auto s = sigmoid_of(gv);
                const auto silu = gv * s;
                const auto dsilu = s * (1.0f + gv * (1.0f - s));  // d/dg g·σ(g)
                const auto d = access.load_at(dy, i);
                access.store_at(dg, i,
                                prior_at(adds, access, dg, i) + d * access.load_at(u, i) * dsilu);
                access.store_at(du, i, prior_at(adds, access, du, i) + d * silu);
              });
        },
        dgate, dup, dout, gate, up);
  });
}

}  // namespace lattice
