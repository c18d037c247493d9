// GELU (tanh form) and SwiGLU: op cases and argument errors.
#include "kernels/activations.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

#include "op_registry.h"

namespace lattice {
namespace {

using optest::Buffer;
using optest::Buffers;
using optest::OpCase;
using optest::TensorList;

double gelu_reference(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

OpCase gelu_case() {
  const Shape shape{3, 50};
  OpCase c;
  c.name = "gelu";
  // [-6, 6): both saturated tails and the curved middle.
  c.inputs = {{"inp", shape, optest::Role::kActivation, -6.0, 6.0}};
  c.outputs = {{"out", shape}};
  c.forward = [](const TensorList& in, TensorList& out) { gelu_forward(out[0], in[0]); };
  c.reference = [](const Buffers& in) {
    Buffer out(in[0].size(), 0.0);
    for (size_t i = 0; i < out.size(); ++i) out[i] = gelu_reference(in[0][i]);
    return Buffers{out};
  };
  c.backward = [](const TensorList& in, const TensorList&, const TensorList& dout,
                  TensorList& grads) { gelu_backward(grads[0], dout[0], in[0]); };
  return c;
}

OpCase swiglu_case() {
  const Shape shape{4, 2, 19};
  OpCase c;
  c.name = "swiglu";
  c.inputs = {{"gate", shape, optest::Role::kActivation, -6.0, 6.0}, {"up", shape}};
  c.outputs = {{"out", shape}};
  c.forward = [](const TensorList& in, TensorList& out) { swiglu_forward(out[0], in[0], in[1]); };
  c.reference = [](const Buffers& in) {
    Buffer out(in[0].size(), 0.0);
    for (size_t i = 0; i < out.size(); ++i) {
      const double g = in[0][i];
      out[i] = g / (1.0 + std::exp(-g)) * in[1][i];
    }
    return Buffers{out};
  };
  c.backward = [](const TensorList& in, const TensorList&, const TensorList& dout,
                  TensorList& grads) {
    swiglu_backward(grads[0], grads[1], dout[0], in[0], in[1]);
  };
  return c;
}

[[maybe_unused]] const bool kRegistered =
    optest::register_op_case(gelu_case()) && optest::register_op_case(swiglu_case());

TEST(Activations, ExtremeInputsSaturateWithoutNaN) {
  Arena arena("test");
  const Buffer x = {-1e4, -200.0, -90.0, 90.0, 200.0, 1e4};
  Tensor inp = optest::make_tensor(arena, {6}, DType::kF32, x);
  Tensor out = Tensor::zeros(arena, {6}, DType::kF32);
  gelu_forward(out, inp);
  EXPECT_EQ(optest::to_buffer(out), (Buffer{-0.0, -0.0, -0.0, 90.0, 200.0, 1e4}));
  Tensor up = optest::make_tensor(arena, {6}, DType::kF32, Buffer(6, 1.0));
  swiglu_forward(out, inp, up);
  EXPECT_EQ(optest::to_buffer(out), (Buffer{-0.0, -0.0, -0.0, 90.0, 200.0, 1e4}));
}

// On f32 tensors the kernels run blocks of 16 elements on vectors (kernels/simd.h) and the last
// n % 16 on scalars. Both give the same bits, infinities and underflow included (a NaN's sign
// aside):
// every element computed alone (a 1-element tensor is all tail) equals the same element of a
// whole run (all vectors). bf16 tensors run the scalar loop throughout: checked the same way.
TEST(Activations, TheVectorBodyAndTheScalarTailGiveTheSameBits) {
  constexpr int64_t n = 16 * 48;
  Buffer x(n), g(n), d(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = -12.0 + 24.0 * double(i) / double(n);  // saturated tails and the curve
    g[i] = 0.5 - double((i * 37) % 101) / 101.0;
    d[i] = double((i * 53) % 97) / 97.0 - 0.3;
  }
  const double specials[] = {std::nan(""), INFINITY, -INFINITY, 1e30,   -1e30, 1e-40,
                             -0.0,         -10.3,    -90.0,     -105.0, 89.5,  45.0};
  for (size_t j = 0; j < std::size(specials); ++j) x[j * 61 % n] = specials[j];
  // Bit for bit, but any NaN equals any NaN (its sign and payload depend on operand order).
  auto same = [](double a, double b) {
    return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
  };
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Arena arena("test");
    // ops(x, g, d, out1, out2): the four kernels into fresh outputs from the same inputs.
    auto run = [&](const Tensor& xs, const Tensor& gs, const Tensor& ds) {
      const Shape shape = xs.shape();
      std::vector<Tensor> outs;
      Tensor act = Tensor::zeros(arena, shape, dtype);
      gelu_forward(act, xs);
      Tensor dx = optest::make_tensor(arena, shape, dtype, optest::to_buffer(gs));
      gelu_backward(dx, ds, xs);
      Tensor glu = Tensor::zeros(arena, shape, dtype);
      swiglu_forward(glu, xs, gs);
      Tensor dgate = optest::make_tensor(arena, shape, dtype, optest::to_buffer(ds));
      Tensor dup = optest::make_tensor(arena, shape, dtype, optest::to_buffer(gs));
      swiglu_backward(dgate, dup, ds, xs, gs);
      return std::vector<Tensor>{act, dx, glu, dgate, dup};
    };
    const std::vector<Tensor> whole =
        run(optest::make_tensor(arena, {n}, dtype, x), optest::make_tensor(arena, {n}, dtype, g),
            optest::make_tensor(arena, {n}, dtype, d));
    const char* names[] = {"gelu fwd", "gelu bwd", "swiglu fwd", "swiglu bwd dgate",
                           "swiglu bwd dup"};
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<Tensor> alone = run(optest::make_tensor(arena, {1}, dtype, {x[size_t(i)]}),
                                            optest::make_tensor(arena, {1}, dtype, {g[size_t(i)]}),
                                            optest::make_tensor(arena, {1}, dtype, {d[size_t(i)]}));
      for (size_t k = 0; k < alone.size(); ++k) {
        const double one = optest::to_buffer(alone[k])[0];
        const double all = optest::to_buffer(whole[k])[size_t(i)];
        ASSERT_TRUE(same(one, all)) << names[k] << " of element " << i << " (x = " << x[size_t(i)]
                                    << "): alone " << one << ", in a vector " << all;
      }
    }
  }
}

// accumulate = false writes the gradients without reading what was there: from NaN everywhere
// they come out as added into zeros, bit for bit (the model skips the zeroing pass this way).
TEST(Activations, WrittenGradientsAreTheBitsOfGradientsAddedIntoZeros) {
  constexpr int64_t n = 16 * 5 + 7;  // vector blocks and a scalar tail
  Buffer x(n), g(n), d(n);
  for (int64_t i = 0; i < n; ++i) {
    x[size_t(i)] = -6.0 + 12.0 * double(i) / double(n);
    g[size_t(i)] = 0.5 - double((i * 37) % 101) / 101.0;
    d[size_t(i)] = double((i * 53) % 97) / 97.0 - 0.3;
  }
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Arena arena("test");
    const Tensor xs = optest::make_tensor(arena, {n}, dtype, x);
    const Tensor gs = optest::make_tensor(arena, {n}, dtype, g);
    const Tensor ds = optest::make_tensor(arena, {n}, dtype, d);
    auto nan = [&] { return optest::make_tensor(arena, {n}, dtype, Buffer(n, std::nan(""))); };
    Tensor added = Tensor::zeros(arena, {n}, dtype), written = nan();
    gelu_backward(added, ds, xs);
    gelu_backward(written, ds, xs, /*accumulate=*/false);
    EXPECT_EQ(optest::to_buffer(written), optest::to_buffer(added)) << "gelu";
    Tensor added_gate = Tensor::zeros(arena, {n}, dtype),
           added_up = Tensor::zeros(arena, {n}, dtype);
    Tensor written_gate = nan(), written_up = nan();
    swiglu_backward(added_gate, added_up, ds, xs, gs);
    swiglu_backward(written_gate, written_up, ds, xs, gs, /*accumulate=*/false);
    EXPECT_EQ(optest::to_buffer(written_gate), optest::to_buffer(added_gate)) << "swiglu dgate";
    EXPECT_EQ(optest::to_buffer(written_up), optest::to_buffer(added_up)) << "swiglu dup";
  }
}

TEST(Activations, BadArgumentsRaiseErrorsNamingKernelAndArgument) {
  Arena arena("test");
  Tensor a = Tensor::zeros(arena, {4, 8}, DType::kF32);
  Tensor b = Tensor::zeros(arena, {4, 8}, DType::kF32);
  Tensor wrong = Tensor::zeros(arena, {8, 4}, DType::kF32);
  Tensor ints = Tensor::zeros(arena, {4, 8}, DType::kI32);
  Tensor f16 = Tensor::zeros(arena, {4, 8}, DType::kF16);
  try {
    gelu_forward(wrong, a);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("gelu_forward: 'out'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gelu_forward(b, ints), DTypeError);
  EXPECT_THROW(gelu_backward(b, f16, a), DTypeError);
  EXPECT_THROW(gelu_backward(b, a, Tensor()), ValueError);
  EXPECT_THROW(swiglu_forward(b, a, wrong), ShapeError);
  EXPECT_THROW(swiglu_backward(b, wrong, a, a, a), ShapeError);
  Tensor undefined;
  EXPECT_THROW(swiglu_backward(undefined, b, a, a, a), ValueError);
}

}  // namespace
}  // namespace lattice
