// Fused softmax cross-entropy with an ignore index.
#include "kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "op_registry.h"

namespace lattice {
namespace {

using optest::ArgSpec;
using optest::Buffer;
using optest::Buffers;
using optest::OpCase;
using optest::Role;
using optest::TensorList;

// -log softmax(logits[n])[targets[n]] in double (max-subtracted), 0 for ignored rows.
Buffer cross_entropy_reference(const Buffer& logits, const Buffer& targets, int64_t vocab,
                               int32_t ignore_index) {
  Buffer losses(targets.size(), 0.0);
  for (size_t n = 0; n < targets.size(); ++n) {
    if (int32_t(targets[n]) == ignore_index) continue;
    const double* row = logits.data() + n * vocab;
    const double max = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
    losses[n] = std::log(sum) + (max - row[size_t(targets[n])]);
  }
  return losses;
}

OpCase cross_entropy_case(std::string name, Shape logits_shape, std::vector<int32_t> targets,
                          int32_t ignore_index, float scale) {
  const int64_t vocab = logits_shape.dim(-1);
  std::vector<int64_t> leading(logits_shape.dims().begin(), logits_shape.dims().end() - 1);
  OpCase c;
  c.name = std::move(name);
  c.inputs = {{"logits", logits_shape, Role::kActivation, -8.0, 8.0},
              ArgSpec::index("targets", Shape(leading), std::move(targets))};
  c.outputs = {{"losses", Shape(leading), Role::kF32}};
  c.forward = [ignore_index](const TensorList& in, TensorList& out) {
    cross_entropy_forward(out[0], in[0], in[1], ignore_index);
  };
  c.reference = [=](const Buffers& in) {
    return Buffers{cross_entropy_reference(in[0], in[1], vocab, ignore_index)};
  };
  c.backward = [=](const TensorList& in, const TensorList&, const TensorList&, TensorList& grads) {
    cross_entropy_backward(grads[0], in[0], in[1], scale, ignore_index);
  };
  c.backward_accumulates = false;
  c.uniform_dout = scale;  // the gradient of Σ scale·loss[n]
  return c;
}

[[maybe_unused]] const bool kRegistered =
    optest::register_op_case(cross_entropy_case("crossentropy", {6, 37},
                                                {3, kIgnoreIndex, 0, 36, 17, kIgnoreIndex},
                                                kIgnoreIndex, 0.25f)) &&
    // V = 300 spans the backward's 256-logit chunks; a custom ignore index; (B, T, V) logits.
    optest::register_op_case(
        cross_entropy_case("crossentropy_rank3", {2, 3, 300}, {299, -1, 0, 150, 256, 7}, -1, 0.5f));

TEST(CrossEntropy, ReturnsTheCountOfTargetsThatAreNotIgnored) {
  Arena arena("test");
  Tensor logits = Tensor::zeros(arena, {4, 5}, DType::kF32);
  Tensor targets = optest::make_tensor(arena, {4}, DType::kI32, {1, kIgnoreIndex, 4, kIgnoreIndex});
  Tensor losses = optest::make_tensor(arena, {4}, DType::kF32, {9, 9, 9, 9});
  EXPECT_EQ(cross_entropy_forward(losses, logits, targets), 2);
  // Uniform logits: loss log 5 for counted rows; ignored rows are written as 0.
  const double log5 = std::log(5.0);
  EXPECT_TRUE(
      optest::buffers_near(optest::to_buffer(losses), {log5, 0, log5, 0}, 1e-6, 1e-6, "losses"));
  Tensor dlogits = optest::make_tensor(arena, {4, 5}, DType::kF32, Buffer(20, 9.0));
  cross_entropy_backward(dlogits, logits, targets, 1.0f);
  const Buffer d = optest::to_buffer(dlogits);
  for (int v = 0; v < 5; ++v) {
    EXPECT_NEAR(d[size_t(v)], v == 1 ? 0.2 - 1.0 : 0.2, 1e-6);
    EXPECT_EQ(d[size_t(5 + v)], 0.0) << "ignored rows get zero gradient";
  }
}

TEST(CrossEntropy, HugeLogitsStayFiniteAndAccurate) {
  Arena arena("test");
  const Buffer x = {1e4, 1e4 + 2.0, 1e4 - 3.0, -1e4, 3e38, 3e38, -3e38, 0.0};
  Tensor logits = optest::make_tensor(arena, {2, 4}, DType::kF32, x);
  Tensor targets = optest::make_tensor(arena, {2}, DType::kI32, {0, 1});
  Tensor losses = Tensor::zeros(arena, {2}, DType::kF32);
  cross_entropy_forward(losses, logits, targets);
  const Buffer expected = cross_entropy_reference(x, {0, 1}, 4, kIgnoreIndex);
  EXPECT_TRUE(optest::buffers_near(optest::to_buffer(losses), expected, 1e-5, 1e-5, "losses"));
  Tensor dlogits = Tensor::zeros(arena, {2, 4}, DType::kF32);
  cross_entropy_backward(dlogits, logits, targets, 1.0f);
  for (double g : optest::to_buffer(dlogits)) EXPECT_TRUE(std::isfinite(g));
}

TEST(CrossEntropy, GradientMayOverwriteTheLogitsInPlace) {
  const OpCase& c = optest::find_op_case("crossentropy_rank3");
  const Buffers inputs = optest::make_inputs(c, true);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Arena arena("test");
    Tensor logits = optest::make_tensor(arena, c.inputs[0].shape, dtype, inputs[0]);
    Tensor targets = optest::make_tensor(arena, c.inputs[1].shape, DType::kI32, inputs[1]);
    Tensor separate = Tensor::zeros(arena, c.inputs[0].shape, dtype);
    cross_entropy_backward(separate, logits, targets, 0.5f, -1);
    cross_entropy_backward(logits, logits, targets, 0.5f, -1);
    EXPECT_EQ(optest::to_buffer(logits), optest::to_buffer(separate));
  }
}

// The row statistics the forward keeps give the backward the same bits as recomputing them, and
// a bf16 gradient written directly is the f32 one rounded (what the cast it replaces gave).
TEST(CrossEntropy, KeptRowStatisticsAndABf16GradientChangeNoBit) {
  const OpCase& c = optest::find_op_case("crossentropy_rank3");
  const Buffers inputs = optest::make_inputs(c, true);
  Arena arena("test");
  const Tensor logits = optest::make_tensor(arena, c.inputs[0].shape, DType::kF32, inputs[0]);
  const Tensor targets = optest::make_tensor(arena, c.inputs[1].shape, DType::kI32, inputs[1]);
  const int64_t rows = targets.numel();
  Tensor losses = Tensor::zeros(arena, targets.shape(), DType::kF32);
  Tensor stats = Tensor::zeros(arena, {2, rows}, DType::kF32);
  cross_entropy_forward(losses, logits, targets, -1, stats);
  const Buffer kept = optest::to_buffer(stats);
  EXPECT_GT(kept[0], 0.0) << "the row max was written";
  EXPECT_GE(kept[size_t(rows)], 1.0) << "Σ exp(x - max) >= 1 was written";
  Tensor recomputed = Tensor::zeros(arena, c.inputs[0].shape, DType::kF32);
  Tensor from_stats = Tensor::zeros(arena, c.inputs[0].shape, DType::kF32);
  Tensor direct_bf16 = Tensor::zeros(arena, c.inputs[0].shape, DType::kBF16);
  cross_entropy_backward(recomputed, logits, targets, 0.5f, -1);
  cross_entropy_backward(from_stats, logits, targets, 0.5f, -1, stats);
  cross_entropy_backward(direct_bf16, logits, targets, 0.5f, -1, stats);
  EXPECT_EQ(optest::to_buffer(from_stats), optest::to_buffer(recomputed));
  EXPECT_EQ(optest::to_buffer(direct_bf16), optest::round_to_bf16(optest::to_buffer(recomputed)));
  // Statistics of other logits are used as given, so they must be these logits' own.
  Tensor wrong = optest::make_tensor(arena, {2, rows}, DType::kF32, Buffer(size_t(2 * rows), 1.0));
  Tensor skewed = Tensor::zeros(arena, c.inputs[0].shape, DType::kF32);
  cross_entropy_backward(skewed, logits, targets, 0.5f, -1, wrong);
  EXPECT_NE(optest::to_buffer(skewed), optest::to_buffer(recomputed));
  Tensor short_stats = Tensor::zeros(arena, {2, rows - 1}, DType::kF32);
  EXPECT_THROW(cross_entropy_forward(losses, logits, targets, -1, short_stats), ShapeError);
  EXPECT_THROW(cross_entropy_backward(recomputed, logits, targets, 0.5f, -1, short_stats),
               ShapeError);
  Tensor bf16_stats = Tensor::zeros(arena, {2, rows}, DType::kBF16);
  EXPECT_THROW(cross_entropy_forward(losses, logits, targets, -1, bf16_stats), DTypeError);
}

TEST(CrossEntropy, SliceBackwardWritesABf16GradientAsTheRoundedF32One) {
  Arena arena("test");
  const int64_t rows = 3, width = 40, valid = 37;
  Buffer x(size_t(rows * width));
  for (size_t i = 0; i < x.size(); ++i) x[i] = double(float(std::sin(double(i) * 1.3) * 4.0));
  const Tensor logits = optest::make_tensor(arena, {rows, width}, DType::kF32, x);
  const Tensor targets = optest::make_tensor(arena, {rows}, DType::kI32, {105, kIgnoreIndex, 130});
  Tensor row_max = Tensor::zeros(arena, {rows}, DType::kF32);
  Tensor sums = Tensor::zeros(arena, {2, rows}, DType::kF32);
  cross_entropy_slice_max(row_max, logits, valid);
  cross_entropy_slice_sums(sums, logits, targets, row_max, 100, valid);
  const Tensor row_sum = sums.slice_rows(0, 1).view({rows});
  Tensor f32 = Tensor::zeros(arena, {rows, width}, DType::kF32);
  Tensor bf16 = Tensor::zeros(arena, {rows, width}, DType::kBF16);
  cross_entropy_slice_backward(f32, logits, targets, row_max, row_sum, 100, valid, 0.25f);
  cross_entropy_slice_backward(bf16, logits, targets, row_max, row_sum, 100, valid, 0.25f);
  const Buffer g = optest::to_buffer(f32);
  EXPECT_EQ(optest::to_buffer(bf16), optest::round_to_bf16(g));
  EXPECT_EQ(g[size_t(width + 3)], 0.0) << "an ignored row";
  EXPECT_EQ(g[size_t(valid)], 0.0) << "a padding column";
  EXPECT_LT(g[5], 0.0) << "the target's logit (class 105) is pushed up";
}

TEST(CrossEntropy, BadArgumentsRaiseErrorsNamingKernelAndArgument) {
  Arena arena("test");
  Tensor logits = Tensor::zeros(arena, {3, 10}, DType::kF32);
  Tensor losses = Tensor::zeros(arena, {3}, DType::kF32);
  Tensor out_of_range = optest::make_tensor(arena, {3}, DType::kI32, {1, 10, 2});
  Tensor negative = optest::make_tensor(arena, {3}, DType::kI32, {1, -5, 2});
  Tensor good = optest::make_tensor(arena, {3}, DType::kI32, {1, 9, 2});
  Tensor float_targets = Tensor::zeros(arena, {3}, DType::kF32);
  Tensor short_losses = Tensor::zeros(arena, {2}, DType::kF32);
  Tensor bf16_losses = Tensor::zeros(arena, {3}, DType::kBF16);
  Tensor flat = Tensor::zeros(arena, {10}, DType::kF32);
  try {
    cross_entropy_forward(losses, logits, out_of_range);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("targets[1] = 10"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cross_entropy_backward(logits, logits, negative, 1.0f), ValueError);
  EXPECT_THROW(cross_entropy_forward(losses, logits, float_targets), DTypeError);
  EXPECT_THROW(cross_entropy_forward(short_losses, logits, good), ShapeError);
  EXPECT_THROW(cross_entropy_forward(bf16_losses, logits, good), DTypeError);
  EXPECT_THROW(cross_entropy_forward(losses, flat, good), ShapeError);
  EXPECT_THROW(cross_entropy_forward(losses, Tensor(), good), ValueError);
  Tensor narrow = Tensor::zeros(arena, {3, 9}, DType::kF32);
  EXPECT_THROW(cross_entropy_backward(narrow, logits, good, 1.0f), ShapeError);
}

}  // namespace
}  // namespace lattice
