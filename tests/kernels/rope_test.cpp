// Rotary position embedding in the HF Llama rotate_half convention.
#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>

#include "op_registry.h"

namespace lattice {
namespace {

using optest::Buffer;
using optest::Buffers;
using optest::OpCase;
using optest::TensorList;

// Naive rotate_half RoPE on (B, T, H, HS) in double.
Buffer rope_reference(const Buffer& x, const Shape& shape, double theta, int64_t offset) {
  const int64_t batch = shape[0], seq = shape[1], heads = shape[2], hs = shape[3], half = hs / 2;
  Buffer out(x.size(), 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = ((b * seq + t) * heads + h) * hs;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = double(offset + t) * std::pow(theta, -2.0 * double(i) / double(hs));
          const double x1 = x[base + i], x2 = x[base + half + i];
          out[base + i] = x1 * std::cos(angle) - x2 * std::sin(angle);
          out[base + half + i] = x2 * std::cos(angle) + x1 * std::sin(angle);
        }
      }
    }
  }
  return out;
}

OpCase rope_case(std::string name, Shape shape, float theta, int64_t offset) {
  OpCase c;
  c.name = std::move(name);
  c.inputs = {{"inp", shape}};
  c.outputs = {{"out", shape}};
  c.forward = [=](const TensorList& in, TensorList& out) {
    rope_forward(out[0], in[0], theta, offset);
  };
  c.reference = [=](const Buffers& in) {
    return Buffers{rope_reference(in[0], shape, double(theta), offset)};
  };
  c.backward = [=](const TensorList&, const TensorList&, const TensorList& dout,
                   TensorList& grads) { rope_backward(grads[0], dout[0], theta, offset); };
  return c;
}

[[maybe_unused]] const bool kRegistered =
    optest::register_op_case(rope_case("rope", {2, 3, 2, 8}, 10000.0f, 5)) &&
    // HS/2 = 68 pairs: more than one 64-pair chunk; Llama 3's theta; a long-context offset.
    optest::register_op_case(rope_case("rope_wide_head", {1, 2, 3, 136}, 500000.0f, 4000));

TEST(Rope, PairsDimensionIWithIPlusHalfAsHuggingFaceLlama) {
  Arena arena("test");
  // HS = 4 at position 1, theta = 100: pair (0, 2) turns by 1 rad, pair (1, 3) by 100^-½ = 0.1.
  Tensor inp = optest::make_tensor(arena, {1, 2, 1, 4}, DType::kF32, {9, 9, 9, 9, 1, 2, 3, 4});
  Tensor out = Tensor::zeros(arena, {1, 2, 1, 4}, DType::kF32);
  rope_forward(out, inp, 100.0f);
  const Buffer got = optest::to_buffer(out);
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.1), s2 = std::sin(0.1);
  const Buffer expected = {
      9, 9, 9, 9, 1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2};
  EXPECT_TRUE(optest::buffers_near(got, expected, 1e-6, 1e-6, "rope out"));
}

TEST(Rope, InPlaceEqualsOutOfPlaceAndBackwardInvertsForward) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Arena arena("test");
    const OpCase& c = optest::find_op_case("rope_wide_head");
    const Buffer x = optest::round_to_bf16(optest::make_inputs(c, true)[0]);
    const Shape shape = c.inputs[0].shape;
    Tensor inp = optest::make_tensor(arena, shape, dtype, x);
    Tensor out = Tensor::zeros(arena, shape, dtype);
    rope_forward(out, inp, 500000.0f, 4000);
    Tensor in_place = optest::make_tensor(arena, shape, dtype, x);
    rope_forward(in_place, in_place, 500000.0f, 4000);
    EXPECT_EQ(optest::to_buffer(in_place), optest::to_buffer(out));
    // The rotation is orthogonal: its transpose (the backward) undoes it.
    Tensor back = Tensor::zeros(arena, shape, DType::kF32);
    rope_backward(back, out, 500000.0f, 4000);
    const double tol = dtype == DType::kF32 ? 1e-5 : 2e-2;
    EXPECT_TRUE(optest::buffers_near(optest::to_buffer(back), x, tol, tol, "R^T R x"));
  }
}

TEST(Rope, BadArgumentsRaiseErrorsNamingKernelAndArgument) {
  Arena arena("test");
  Tensor odd = Tensor::zeros(arena, {1, 2, 2, 7}, DType::kF32);
  Tensor rank3 = Tensor::zeros(arena, {2, 2, 8}, DType::kF32);
  Tensor x = Tensor::zeros(arena, {1, 2, 2, 8}, DType::kF32);
  Tensor other = Tensor::zeros(arena, {1, 2, 4, 4}, DType::kF32);
  Tensor f16 = Tensor::zeros(arena, {1, 2, 2, 8}, DType::kF16);
  try {
    rope_forward(odd, odd, 10000.0f);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("rope_forward"), std::string::npos) << e.what();
  }
  EXPECT_THROW(rope_forward(rank3, rank3, 10000.0f), ShapeError);
  EXPECT_THROW(rope_forward(other, x, 10000.0f), ShapeError);
  EXPECT_THROW(rope_forward(x, x, 0.0f), ValueError);
  EXPECT_THROW(rope_forward(x, x, 10000.0f, -1), ValueError);
  EXPECT_THROW(rope_backward(x, f16, 10000.0f), DTypeError);
}

}  // namespace
}  // namespace lattice
