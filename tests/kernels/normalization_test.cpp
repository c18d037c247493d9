// LayerNorm and RMSNorm: op cases (double reference, finite differences, bf16) and the tests
// that do not fit the registry (errors, stability, thread-count independence).
#include "kernels/normalization.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/thread_budget.h"
#include "op_registry.h"

namespace lattice {
namespace {

using optest::ArgSpec;
using optest::Buffer;
using optest::Buffers;
using optest::OpCase;
using optest::Role;
using optest::TensorList;

constexpr double kEps = 1e-5;

// Per row of (rows, width): out, mean, rstd.
Buffers layernorm_reference(const Buffers& in, int64_t rows, int64_t width, bool has_bias) {
  const Buffer& x = in[0];
  const Buffer& w = in[1];
  Buffer out(x.size(), 0.0), mean(size_t(rows), 0.0), rstd(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0.0;
    for (int64_t c = 0; c < width; ++c) m += x[r * width + c];
    m /= double(width);
    double var = 0.0;
    for (int64_t c = 0; c < width; ++c) var += (x[r * width + c] - m) * (x[r * width + c] - m);
    var /= double(width);
    const double s = 1.0 / std::sqrt(var + kEps);
    mean[r] = m;
    rstd[r] = s;
    for (int64_t c = 0; c < width; ++c) {
      out[r * width + c] = (x[r * width + c] - m) * s * w[c] + (has_bias ? in[2][c] : 0.0);
    }
  }
  return {out, mean, rstd};
}

OpCase layernorm_case(std::string name, Shape shape, Shape stats, bool has_bias) {
  const int64_t width = shape.dim(-1);
  const int64_t rows = shape.numel() / width;
  OpCase c;
  c.name = std::move(name);
  c.inputs = {{"inp", shape}, {"weight", {width}, Role::kParameter, 0.5, 1.5}};
  if (has_bias) c.inputs.push_back({"bias", {width}, Role::kParameter});
  c.outputs = {
      {"out", shape}, {"mean", stats, Role::kStatistic}, {"rstd", stats, Role::kStatistic}};
  c.forward = [has_bias](const TensorList& in, TensorList& out) {
    layernorm_forward(out[0], out[1], out[2], in[0], in[1], has_bias ? in[2] : Tensor(),
                      float(kEps));
  };
  c.reference = [=](const Buffers& in) { return layernorm_reference(in, rows, width, has_bias); };
  c.backward = [has_bias](const TensorList& in, const TensorList& out, const TensorList& dout,
                          TensorList& grads) {
    Tensor no_bias;
    layernorm_backward(grads[0], grads[1], has_bias ? grads[2] : no_bias, dout[0], in[0], in[1],
                       out[1], out[2]);
  };
  return c;
}

OpCase rmsnorm_case(std::string name, Shape shape) {
  const int64_t width = shape.dim(-1);
  const int64_t rows = shape.numel() / width;
  OpCase c;
  c.name = std::move(name);
  c.inputs = {{"inp", shape}, {"weight", {width}, Role::kParameter, 0.5, 1.5}};
  c.outputs = {{"out", shape}, {"rstd", {rows}, Role::kStatistic}};
  c.forward = [](const TensorList& in, TensorList& out) {
    rmsnorm_forward(out[0], out[1], in[0], in[1], float(kEps));
  };
  c.reference = [=](const Buffers& in) {
    const Buffer& x = in[0];
    Buffer out(x.size(), 0.0), rstd(size_t(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double ms = 0.0;
      for (int64_t col = 0; col < width; ++col) ms += x[r * width + col] * x[r * width + col];
      rstd[r] = 1.0 / std::sqrt(ms / double(width) + kEps);
      for (int64_t col = 0; col < width; ++col) {
        out[r * width + col] = x[r * width + col] * rstd[r] * in[1][col];
      }
    }
    return Buffers{out, rstd};
  };
  c.backward = [](const TensorList& in, const TensorList& out, const TensorList& dout,
                  TensorList& grads) {
    rmsnorm_backward(grads[0], grads[1], dout[0], in[0], in[1], out[1]);
  };
  return c;
}

[[maybe_unused]] const bool kRegistered =
    optest::register_op_case(layernorm_case("layernorm_bias", {6, 40}, {6}, true)) &&
    optest::register_op_case(layernorm_case("layernorm_nobias_rank3", {2, 3, 20}, {2, 3}, false)) &&
    optest::register_op_case(rmsnorm_case("rmsnorm", {5, 36}));

TEST(LayerNorm, RowsWithALargeMeanKeepTheirPrecision) {
  // E[x²] - E[x]² would cancel catastrophically here; the two-pass mean and variance do not.
  Arena arena("test");
  const int64_t width = 64;
  Buffer x(width), w(width, 1.0), b(width, 0.0);
  for (int64_t c = 0; c < width; ++c) x[c] = double(float(1000.0 + 0.01 * double(c % 7)));
  Tensor inp = optest::make_tensor(arena, {1, width}, DType::kF32, x);
  Tensor weight = optest::make_tensor(arena, {width}, DType::kF32, w);
  Tensor bias = optest::make_tensor(arena, {width}, DType::kF32, b);
  Tensor out = Tensor::zeros(arena, {1, width}, DType::kF32);
  Tensor mean = Tensor::zeros(arena, {1}, DType::kF32);
  Tensor rstd = Tensor::zeros(arena, {1}, DType::kF32);
  layernorm_forward(out, mean, rstd, inp, weight, bias, float(kEps));
  const Buffer expected = layernorm_reference({x, w, b}, 1, width, true)[0];
  // The inputs differ from the mean by ~0.01 at magnitude 1000: fp32 holds them to ~6e-5
  // absolute, so normalised values (std ≈ 0.02) are good to ~1e-2 relative, not 1e-5.
  EXPECT_TRUE(optest::buffers_near(optest::to_buffer(out), expected, 1e-2, 1e-2, "out"));
}

// Parameter gradients sum rows through fixed blocks: thread count must not change a bit.
TEST(LayerNorm, BackwardIsBitwiseIdenticalForAnyThreadCount) {
  Arena arena("test");
  const int64_t rows = 700, width = 96;  // 67k elements: above the parallel threshold
  OpCase c = layernorm_case("layernorm_threads", {rows, width}, {rows}, true);
  const Buffers inputs = optest::make_inputs(c, false);
  const Buffers douts = optest::make_douts(c, false);
  set_thread_budget(1);
  const optest::CaseResult one = optest::run_case(c, inputs, douts, DType::kF32, 1);
  set_thread_budget(2);
  const optest::CaseResult two = optest::run_case(c, inputs, douts, DType::kF32, 1);
  set_thread_budget(1);
  for (size_t k = 0; k < one.grads.size(); ++k) EXPECT_EQ(one.grads[k], two.grads[k]) << k;
  for (size_t o = 0; o < one.outputs.size(); ++o) EXPECT_EQ(one.outputs[o], two.outputs[o]) << o;
}

TEST(Normalization, BadArgumentsRaiseErrorsNamingKernelAndArgument) {
  Arena arena("test");
  Tensor inp = Tensor::zeros(arena, {4, 8}, DType::kF32);
  Tensor out = Tensor::zeros(arena, {4, 8}, DType::kF32);
  Tensor mean = Tensor::zeros(arena, {4}, DType::kF32);
  Tensor rstd = Tensor::zeros(arena, {4}, DType::kF32);
  Tensor weight = Tensor::zeros(arena, {8}, DType::kF32);
  Tensor short_weight = Tensor::zeros(arena, {7}, DType::kF32);
  Tensor bf16_stats = Tensor::zeros(arena, {4}, DType::kBF16);
  Tensor int_inp = Tensor::zeros(arena, {4, 8}, DType::kI32);
  try {
    layernorm_forward(out, mean, rstd, inp, short_weight, Tensor());
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("layernorm_forward: 'weight'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(layernorm_forward(out, bf16_stats, rstd, inp, weight, Tensor()), DTypeError);
  EXPECT_THROW(layernorm_forward(out, mean, rstd, int_inp, weight, Tensor()), DTypeError);
  EXPECT_THROW(layernorm_forward(out, mean, rstd, inp, Tensor(), Tensor()), ValueError);
  EXPECT_THROW(layernorm_forward(out, mean, rstd, inp, weight, Tensor(), 0.0f), ValueError);
  Tensor wrong_out = Tensor::zeros(arena, {4, 9}, DType::kF32);
  EXPECT_THROW(rmsnorm_forward(wrong_out, rstd, inp, weight), ShapeError);
  Tensor dweight_bf16 = Tensor::zeros(arena, {8}, DType::kBF16);
  Tensor dinp = Tensor::zeros(arena, {4, 8}, DType::kF32);
  EXPECT_THROW(rmsnorm_backward(dinp, dweight_bf16, out, inp, weight, rstd), DTypeError);
  Tensor wrong_rstd = Tensor::zeros(arena, {5}, DType::kF32);
  EXPECT_THROW(rmsnorm_backward(dinp, weight, out, inp, weight, wrong_rstd), ShapeError);
}

}  // namespace
}  // namespace lattice
