// Token embeddings (with the vocab_start range rule for vocab-parallel shards) and learned
// position embeddings.
#include "kernels/embedding.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/kernel_support.h"

namespace lattice {

using kernel::Elem;
using kernel::load;
using kernel::store_as;
using kernel::visit_floats;

namespace {

// Columns one thread owns in embedding_backward: 64 floats = 4 cache lines per row it touches.
constexpr int64_t kColumnBlock = 64;

// Checks that `rows_tensor` is ids.shape + [C] and returns C.
void expect_token_rows(const Tensor& rows_tensor, const Tensor& ids, int64_t width,
                       std::string_view op, std::string_view what) {
  std::vector<int64_t> dims = ids.shape().dims();
  dims.push_back(width);
  expect_shape(rows_tensor, Shape(std::move(dims)), op, what);
}

void expect_table(const Tensor& table, std::string_view op, std::string_view what) {
  expect_rank(table, 2, op, what);
}

// (B, T, C) activations against a (maxT, C) position table.
void expect_positions(const Tensor& act, const Tensor& table, int64_t position_offset,
                      std::string_view op, std::string_view act_name, std::string_view table_name) {
  expect_rank(act, 3, op, act_name);
  expect_rank(table, 2, op, table_name);
  if (act.dim(2) != table.dim(1)) {
    LATTICE_THROW(ShapeError, "{}: '{}' {} and '{}' {} disagree on the width C", op, act_name,
                  act.shape().to_string(), table_name, table.shape().to_string());
  }
  const int64_t seq = act.dim(1);
  if (position_offset < 0 || position_offset + seq > table.dim(0)) {
    LATTICE_THROW(ValueError,
                  "{}: positions [{}, {}) fall outside the {} rows of '{}' ---> HINT: raise the "
                  "model's maximum sequence length or shorten the sequence",
                  op, position_offset, position_offset + seq, table.dim(0), table_name);
  }
}

}  // namespace

void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table, int64_t vocab_start) {
  const KernelTimer timer("embedding fwd", 0, kernel::bytes_of({&out, &ids}));
  constexpr std::string_view kOp = "embedding_forward";
  expect_dtype(ids, DType::kI32, kOp, "ids");
  expect_float_dtype(table, kOp, "table");
  expect_table(table, kOp, "table");
  expect_float_dtype(out, kOp, "out");
  const int64_t rows = table.dim(0);
  const int64_t width = table.dim(1);
  expect_token_rows(out, ids, width, kOp, "out");
  const int64_t tokens = ids.numel();
  const int32_t* pid = ids.data<int32_t>();
  visit_floats(
      [&](auto* o, auto* t) {
        using O = Elem<decltype(o)>;
        LATTICE_PARALLEL_FOR(tokens * width)
        for (int64_t n = 0; n < tokens; ++n) {
          const int64_t row = int64_t(pid[n]) - vocab_start;
          O* orow = o + n * width;
          if (row < 0 || row >= rows) {
            std::memset(static_cast<void*>(orow), 0, size_t(width) * sizeof(O));
            continue;
          }
          const auto* trow = t + row * width;
          for (int64_t c = 0; c < width; ++c) orow[c] = store_as<O>(load(trow[c]));
        }
      },
      out, table);
}

void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& ids,
                        int64_t vocab_start) {
  const KernelTimer timer("embedding bwd", 0, kernel::bytes_of({&dout, &ids}));
  constexpr std::string_view kOp = "embedding_backward";
  expect_dtype(ids, DType::kI32, kOp, "ids");
  expect_dtype(dtable, DType::kF32, kOp, "dtable");
  expect_table(dtable, kOp, "dtable");
  expect_float_dtype(dout, kOp, "dout");
  const int64_t rows = dtable.dim(0);
  const int64_t width = dtable.dim(1);
  expect_token_rows(dout, ids, width, kOp, "dout");
  const int64_t tokens = ids.numel();
  const int32_t* pid = ids.data<int32_t>();
  float* dt = dtable.data<float>();
  // A scatter-add: tokens with the same id hit the same row. Threads own column blocks, so no
  // two threads write one element, and each element sums its tokens in order (deterministic
  // for any thread count).
  const int64_t blocks = (width + kColumnBlock - 1) / kColumnBlock;
  visit_floats(
      [&](auto* dy) {
        LATTICE_PARALLEL_FOR(tokens * width)
        for (int64_t block = 0; block < blocks; ++block) {
          const int64_t begin = block * kColumnBlock;
          const int64_t end = std::min(width, begin + kColumnBlock);
          for (int64_t n = 0; n < tokens; ++n) {
            const int64_t row = int64_t(pid[n]) - vocab_start;
            if (row < 0 || row >= rows) continue;
            float* drow = dt + row * width;
            const auto* dyrow = dy + n * width;
            for (int64_t c = begin; c < end; ++c) drow[c] += load(dyrow[c]);
          }
        }
      },
      dout);
}

void position_embedding_forward(Tensor& out, const Tensor& wpe, int64_t position_offset) {
  const KernelTimer timer("position embedding fwd", 0, kernel::bytes_of({&out}));
  constexpr std::string_view kOp = "position_embedding_forward";
  expect_float_dtype(out, kOp, "out");
  expect_float_dtype(wpe, kOp, "wpe");
  expect_positions(out, wpe, position_offset, kOp, "out", "wpe");
  const int64_t batch = out.dim(0);
  const int64_t seq = out.dim(1);
  const int64_t width = out.dim(2);
  visit_floats(
      [&](auto* o, auto* w) {
        using O = Elem<decltype(o)>;
        LATTICE_PARALLEL_FOR(batch * seq * width)
        for (int64_t bt = 0; bt < batch * seq; ++bt) {
          O* orow = o + bt * width;
          const auto* wrow = w + (position_offset + bt % seq) * width;
          for (int64_t c = 0; c < width; ++c) orow[c] = store_as<O>(load(orow[c]) + load(wrow[c]));
        }
      },
      out, wpe);
}

void position_embedding_backward(Tensor& dwpe, const Tensor& dout, int64_t position_offset) {
  const KernelTimer timer("position embedding bwd", 0, kernel::bytes_of({&dout}));
  constexpr std::string_view kOp = "position_embedding_backward";
  expect_dtype(dwpe, DType::kF32, kOp, "dwpe");
  expect_float_dtype(dout, kOp, "dout");
  expect_positions(dout, dwpe, position_offset, kOp, "dout", "dwpe");
  const int64_t batch = dout.dim(0);
  const int64_t seq = dout.dim(1);
  const int64_t width = dout.dim(2);
  float* dw = dwpe.data<float>();
  visit_floats(
      [&](auto* dy) {
        // Each position is its own row of dwpe: parallel over t, batch summed in order.
        LATTICE_PARALLEL_FOR(batch * seq * width)
        for (int64_t t = 0; t < seq; ++t) {
          float* drow = dw + (position_offset + t) * width;
          for (int64_t b = 0; b < batch; ++b) {
            const auto* dyrow = dy + (b * seq + t) * width;
            for (int64_t c = 0; c < width; ++c) drow[c] += load(dyrow[c]);
          }
        }
      },
      dout);
}

}  // namespace lattice
