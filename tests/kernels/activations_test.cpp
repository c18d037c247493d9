// GELU (tanh form) and SwiGLU: op cases and argument errors.
#include "kernels/activations.h"

#include <gtest/gtest.h>

#include <cmath>

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
