// Token embeddings (with the vocab_start range rule) and learned positions.
#include "kernels/embedding.h"

#include <gtest/gtest.h>

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

// A table of `rows` rows starting at vocabulary id vocab_start; ids outside give zero rows.
OpCase embedding_case(std::string name, Shape ids_shape, std::vector<int32_t> ids, int64_t rows,
                      int64_t width, int64_t vocab_start) {
  std::vector<int64_t> out_dims = ids_shape.dims();
  out_dims.push_back(width);
  OpCase c;
  c.name = std::move(name);
  c.inputs = {ArgSpec::index("ids", ids_shape, std::move(ids)),
              {"table", {rows, width}, Role::kParameter}};
  c.outputs = {{"out", Shape(out_dims)}};
  c.forward = [vocab_start](const TensorList& in, TensorList& out) {
    embedding_forward(out[0], in[0], in[1], vocab_start);
  };
  c.reference = [=](const Buffers& in) {
    Buffer out(size_t(in[0].size() * width), 0.0);
    for (size_t n = 0; n < in[0].size(); ++n) {
      const int64_t row = int64_t(in[0][n]) - vocab_start;
      if (row < 0 || row >= rows) continue;
      for (int64_t col = 0; col < width; ++col) out[n * width + col] = in[1][row * width + col];
    }
    return Buffers{out};
  };
  c.backward = [vocab_start](const TensorList& in, const TensorList&, const TensorList& dout,
                             TensorList& grads) {
    embedding_backward(grads[0], dout[0], in[0], vocab_start);
  };
  // A lookup copies: the f32 forward is exact.
  c.tolerance.forward_atol = 0.0;
  c.tolerance.forward_rtol = 0.0;
  return c;
}

// out = base + wpe[offset + t]; only wpe is differentiated (base's gradient is the identity).
OpCase position_case() {
  const int64_t batch = 3, seq = 4, width = 20, max_seq = 7, offset = 2;
  OpCase c;
  c.name = "position_embedding";
  c.inputs = {{"base", {batch, seq, width}, Role::kActivation, -2.0, 2.0, false},
              {"wpe", {max_seq, width}, Role::kParameter}};
  c.outputs = {{"out", {batch, seq, width}}};
  c.forward = [](const TensorList& in, TensorList& out) {
    out[0].copy_from(in[0]);
    position_embedding_forward(out[0], in[1], offset);
  };
  c.reference = [=](const Buffers& in) {
    Buffer out = in[0];
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < seq; ++t) {
        for (int64_t col = 0; col < width; ++col) {
          out[(b * seq + t) * width + col] += in[1][(offset + t) * width + col];
        }
      }
    }
    return Buffers{out};
  };
  c.backward = [](const TensorList&, const TensorList&, const TensorList& dout, TensorList& grads) {
    position_embedding_backward(grads[0], dout[0], offset);
  };
  return c;
}

[[maybe_unused]] const bool kRegistered =
    optest::register_op_case(
        embedding_case("embedding", {9}, {3, 0, 9, 3, 5, 3, 7, 1, 0}, 10, 24, 0)) &&
    // A vocab-parallel shard holding ids [4, 9): the rest (and a negative id) read as zeros.
    optest::register_op_case(
        embedding_case("embedding_vocab_shard", {2, 4}, {0, 4, 8, 9, 5, 4, 12, -1}, 5, 17, 4)) &&
    optest::register_op_case(position_case());

TEST(Embedding, IdsOutsideTheShardGiveZeroRowsAndNoGradient) {
  Arena arena("test");
  Tensor table = optest::make_tensor(arena, {2, 3}, DType::kF32, {1, 2, 3, 4, 5, 6});
  Tensor ids = optest::make_tensor(arena, {4}, DType::kI32, {10, 9, 11, 12});
  Tensor out = optest::make_tensor(arena, {4, 3}, DType::kF32, Buffer(12, 7.0));
  embedding_forward(out, ids, table, /*vocab_start=*/10);
  EXPECT_EQ(optest::to_buffer(out), (Buffer{1, 2, 3, 0, 0, 0, 4, 5, 6, 0, 0, 0}));
  Tensor dtable = Tensor::zeros(arena, {2, 3}, DType::kF32);
  Tensor dout = optest::make_tensor(arena, {4, 3}, DType::kF32, Buffer(12, 1.0));
  embedding_backward(dtable, dout, ids, 10);
  EXPECT_EQ(optest::to_buffer(dtable), (Buffer{1, 1, 1, 1, 1, 1}));
}

// The scatter-add gives each thread whole column blocks: the thread count cannot change a bit.
TEST(Embedding, BackwardIsBitwiseIdenticalForAnyThreadCount) {
  const int64_t tokens = 600, rows = 50, width = 200;  // 120k elements: parallel
  std::vector<int32_t> ids(size_t(tokens), 0);
  for (int64_t n = 0; n < tokens; ++n) ids[size_t(n)] = int32_t((n * 7) % 61) - 5;  // some outside
  OpCase c = embedding_case("embedding_threads", {tokens}, ids, rows, width, 3);
  const Buffers inputs = optest::make_inputs(c, false);
  const Buffers douts = optest::make_douts(c, false);
  set_thread_budget(1);
  const optest::CaseResult one = optest::run_case(c, inputs, douts, DType::kF32, 1);
  set_thread_budget(2);
  const optest::CaseResult two = optest::run_case(c, inputs, douts, DType::kF32, 1);
  set_thread_budget(1);
  EXPECT_EQ(one.grads[0], two.grads[0]);
  EXPECT_EQ(one.outputs[0], two.outputs[0]);
  EXPECT_TRUE(optest::buffers_near(two.outputs[0], c.reference(inputs)[0], 0.0, 0.0, "out"));
}

TEST(Embedding, BadArgumentsRaiseErrorsNamingKernelAndArgument) {
  Arena arena("test");
  Tensor table = Tensor::zeros(arena, {5, 8}, DType::kF32);
  Tensor ids = Tensor::zeros(arena, {4}, DType::kI32);
  Tensor float_ids = Tensor::zeros(arena, {4}, DType::kF32);
  Tensor out = Tensor::zeros(arena, {4, 8}, DType::kF32);
  Tensor wrong_out = Tensor::zeros(arena, {4, 7}, DType::kF32);
  Tensor bf16_dtable = Tensor::zeros(arena, {5, 8}, DType::kBF16);
  try {
    embedding_forward(wrong_out, ids, table);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("embedding_forward: 'out'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(embedding_forward(out, float_ids, table), DTypeError);
  EXPECT_THROW(embedding_forward(out, ids, Tensor()), ValueError);
  EXPECT_THROW(embedding_backward(bf16_dtable, out, ids), DTypeError);
  EXPECT_THROW(embedding_backward(table, wrong_out, ids), ShapeError);

  Tensor act = Tensor::zeros(arena, {2, 4, 8}, DType::kF32);
  Tensor wpe = Tensor::zeros(arena, {6, 8}, DType::kF32);
  Tensor narrow_wpe = Tensor::zeros(arena, {6, 7}, DType::kF32);
  // Positions [3, 7) do not fit 6 rows.
  try {
    position_embedding_forward(act, wpe, 3);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(position_embedding_forward(act, wpe, 2));
  EXPECT_THROW(position_embedding_forward(act, wpe, -1), ValueError);
  EXPECT_THROW(position_embedding_forward(act, narrow_wpe, 0), ShapeError);
  EXPECT_THROW(position_embedding_backward(narrow_wpe, act, 0), ShapeError);
  EXPECT_THROW(position_embedding_forward(out, wpe, 0), ShapeError);  // rank 2, not (B, T, C)
}

}  // namespace
}  // namespace lattice
