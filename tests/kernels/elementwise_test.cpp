// The small helpers between the big kernels: add, axpy, scale, sum_squares, bias_backward,
// split_last_dim, concat_last_dim.
#include "kernels/elementwise.h"

#include <gtest/gtest.h>

#include "core/thread_budget.h"
#include "op_registry.h"

namespace lattice {
namespace {

using optest::Buffer;
using optest::Buffers;
using optest::OpCase;
using optest::Role;
using optest::TensorList;

constexpr int64_t kRows = 5;
const std::vector<int64_t> kWidths = {3, 17, 6};  // Σ = 26

// Exact ops (copies, one add) are held to zero tolerance in f32.
void exact(OpCase& c) {
  c.tolerance.forward_atol = 0.0;
  c.tolerance.forward_rtol = 0.0;
}

OpCase add_case() {
  const Shape shape{4, 33};
  OpCase c;
  c.name = "add";
  c.inputs = {{"a", shape}, {"b", shape}};
  c.outputs = {{"out", shape}};
  c.forward = [](const TensorList& in, TensorList& out) { add(out[0], in[0], in[1]); };
  c.reference = [](const Buffers& in) {
    Buffer out(in[0].size(), 0.0);
    for (size_t i = 0; i < out.size(); ++i) out[i] = double(float(in[0][i] + in[1][i]));
    return Buffers{out};
  };
  exact(c);
  return c;
}

OpCase axpy_case() {
  const Shape shape{3, 21};
  const float alpha = -0.75f;
  OpCase c;
  c.name = "axpy";
  c.inputs = {{"y", shape}, {"x", shape}};
  c.outputs = {{"out", shape}};
  c.forward = [=](const TensorList& in, TensorList& out) {
    out[0].copy_from(in[0]);
    axpy(out[0], alpha, in[1]);
  };
  c.reference = [=](const Buffers& in) {
    Buffer out(in[0].size(), 0.0);
    for (size_t i = 0; i < out.size(); ++i) out[i] = in[0][i] + double(alpha) * in[1][i];
    return Buffers{out};
  };
  return c;
}

OpCase scale_case() {
  const Shape shape{50};
  OpCase c;
  c.name = "scale";
  c.inputs = {{"x", shape}};
  c.outputs = {{"out", shape}};
  c.forward = [](const TensorList& in, TensorList& out) {
    out[0].copy_from(in[0]);
    scale(out[0], 0.3f);
  };
  c.reference = [](const Buffers& in) {
    Buffer out(in[0].size(), 0.0);
    for (size_t i = 0; i < out.size(); ++i) out[i] = double(0.3f) * in[0][i];
    return Buffers{out};
  };
  return c;
}

OpCase sum_squares_case() {
  OpCase c;
  c.name = "sumsquares";
  c.inputs = {{"x", {3, 3001}}};  // three reduction chunks and a ragged end
  c.outputs = {{"total", {1}, Role::kF32}};
  c.forward = [](const TensorList& in, TensorList& out) {
    out[0].data<float>()[0] = float(sum_squares(in[0]));
  };
  c.reference = [](const Buffers& in) {
    double total = 0.0;
    for (double v : in[0]) total += v * v;
    return Buffers{{total}};
  };
  return c;
}

OpCase bias_backward_case() {
  const int64_t rows = 7, width = 70;  // two 64-column blocks
  OpCase c;
  c.name = "biasbackward";
  c.inputs = {{"dbias", {width}, Role::kF32}, {"dout", {rows, width}}};
  c.outputs = {{"dbias_out", {width}, Role::kF32}};
  c.forward = [](const TensorList& in, TensorList& out) {
    out[0].copy_from(in[0]);  // dbias accumulates onto what was there
    bias_backward(out[0], in[1]);
  };
  c.reference = [=](const Buffers& in) {
    Buffer out = in[0];
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t col = 0; col < width; ++col) out[col] += in[1][r * width + col];
    }
    return Buffers{out};
  };
  return c;
}

// Reference split of a (rows, Σ widths) buffer into its column blocks.
Buffers split_reference(const Buffer& whole) {
  int64_t total = 0;
  for (int64_t w : kWidths) total += w;
  Buffers parts;
  int64_t offset = 0;
  for (int64_t w : kWidths) {
    Buffer part;
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t col = 0; col < w; ++col) part.push_back(whole[r * total + offset + col]);
    }
    parts.push_back(part);
    offset += w;
  }
  return parts;
}

Buffer concat_reference(const Buffers& parts) {
  Buffer whole;
  for (int64_t r = 0; r < kRows; ++r) {
    for (size_t k = 0; k < kWidths.size(); ++k) {
      for (int64_t col = 0; col < kWidths[k]; ++col)
        whole.push_back(parts[k][r * kWidths[k] + col]);
    }
  }
  return whole;
}

OpCase split_case() {
  OpCase c;
  c.name = "split";
  c.inputs = {{"inp", {kRows, 26}}};
  c.outputs = {{"q", {kRows, kWidths[0]}}, {"k", {kRows, kWidths[1]}}, {"v", {kRows, kWidths[2]}}};
  c.forward = [](const TensorList& in, TensorList& out) {
    split_last_dim({&out[0], &out[1], &out[2]}, in[0]);
  };
  c.reference = [](const Buffers& in) { return split_reference(in[0]); };
  exact(c);
  return c;
}

OpCase concat_case(bool accumulate) {
  OpCase c;
  c.name = accumulate ? "concat_accumulate" : "concat";
  c.inputs = {{"q", {kRows, kWidths[0]}}, {"k", {kRows, kWidths[1]}}, {"v", {kRows, kWidths[2]}}};
  if (accumulate) c.inputs.push_back({"base", {kRows, 26}});
  c.outputs = {{"out", {kRows, 26}}};
  c.forward = [accumulate](const TensorList& in, TensorList& out) {
    if (accumulate) out[0].copy_from(in[3]);
    concat_last_dim(out[0], {&in[0], &in[1], &in[2]}, accumulate);
  };
  c.reference = [accumulate](const Buffers& in) {
    Buffer whole = concat_reference({in[0], in[1], in[2]});
    if (accumulate) {
      for (size_t i = 0; i < whole.size(); ++i) whole[i] = double(float(whole[i] + in[3][i]));
    }
    return Buffers{whole};
  };
  exact(c);
  return c;
}

[[maybe_unused]] const bool kRegistered =
    optest::register_op_case(add_case()) && optest::register_op_case(axpy_case()) &&
    optest::register_op_case(scale_case()) && optest::register_op_case(sum_squares_case()) &&
    optest::register_op_case(bias_backward_case()) && optest::register_op_case(split_case()) &&
    optest::register_op_case(concat_case(false)) && optest::register_op_case(concat_case(true));

TEST(Elementwise, AddMayWriteIntoEitherInput) {
  Arena arena("test");
  Tensor a = optest::make_tensor(arena, {3}, DType::kF32, {1, 2, 3});
  Tensor b = optest::make_tensor(arena, {3}, DType::kF32, {10, 20, 30});
  add(a, a, b);
  EXPECT_EQ(optest::to_buffer(a), (Buffer{11, 22, 33}));
  add(b, a, b);
  EXPECT_EQ(optest::to_buffer(b), (Buffer{21, 42, 63}));
}

TEST(Elementwise, SumSquaresIsBitwiseIdenticalForAnyThreadCount) {
  Arena arena("test");
  Buffer x(200000, 0.0);
  for (size_t i = 0; i < x.size(); ++i) x[i] = double(float(std::sin(double(i)) * 3.0));
  Tensor t = optest::make_tensor(arena, {int64_t(x.size())}, DType::kF32, x);
  set_thread_budget(1);
  const double one = sum_squares(t);
  set_thread_budget(2);
  const double two = sum_squares(t);
  set_thread_budget(1);
  EXPECT_EQ(one, two);
  double serial = 0.0;
  for (double v : x) serial += v * v;
  EXPECT_NEAR(one, serial, 1e-9 * serial);
}

TEST(Elementwise, BadArgumentsRaiseErrorsNamingKernelAndArgument) {
  Arena arena("test");
  Tensor a = Tensor::zeros(arena, {4, 6}, DType::kF32);
  Tensor b = Tensor::zeros(arena, {4, 6}, DType::kF32);
  Tensor wrong = Tensor::zeros(arena, {6, 4}, DType::kF32);
  Tensor ints = Tensor::zeros(arena, {4, 6}, DType::kI32);
  Tensor f16 = Tensor::zeros(arena, {4, 6}, DType::kF16);
  try {
    add(a, a, wrong);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("add: 'out'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(axpy(a, 1.0f, ints), DTypeError);
  EXPECT_THROW(scale(f16, 1.0f), DTypeError);
  EXPECT_THROW(sum_squares(Tensor()), ValueError);
  Tensor dbias_bf16 = Tensor::zeros(arena, {6}, DType::kBF16);
  Tensor dbias_short = Tensor::zeros(arena, {5}, DType::kF32);
  EXPECT_THROW(bias_backward(dbias_bf16, a), DTypeError);
  EXPECT_THROW(bias_backward(dbias_short, a), ShapeError);

  Tensor q = Tensor::zeros(arena, {4, 2}, DType::kF32);
  Tensor k = Tensor::zeros(arena, {4, 3}, DType::kBF16);
  Tensor other_rows = Tensor::zeros(arena, {3, 1}, DType::kF32);
  Tensor v = Tensor::zeros(arena, {4, 1}, DType::kF32);
  EXPECT_NO_THROW(split_last_dim({&q, &k, &v}, a));
  EXPECT_NO_THROW(concat_last_dim(b, {&q, &k, &v}));
  try {
    split_last_dim({&q, &k}, a);  // widths 2 + 3 != 6
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("split_last_dim"), std::string::npos) << e.what();
  }
  EXPECT_THROW(split_last_dim({&q, &k, &other_rows}, a), ShapeError);
  EXPECT_THROW(concat_last_dim(b, {&q, &k, nullptr}), ValueError);
  Tensor f16_part = Tensor::zeros(arena, {4, 1}, DType::kF16);
  EXPECT_THROW(concat_last_dim(b, {&q, &k, &f16_part}), DTypeError);
}

}  // namespace
}  // namespace lattice
