// Softmax cross-entropy, one row of V logits at a time, never materialising probabilities:
// log-sum-exp with the row maximum subtracted (no overflow for any finite logits), and the
// backward recomputes exp(x - max) / sum in the same pass that writes the gradient.
#include "kernels/cross_entropy.h"

#include <cmath>
#include <vector>

#include "kernels/kernel_support.h"
#include "kernels/simd.h"

namespace lattice {

using kernel::Elem;
using kernel::exp_fast;
using kernel::exp_vec;
using kernel::kVecLanes;
using kernel::load;
using kernel::load_vec;
using kernel::max_lanes;
using kernel::store_as;
using kernel::store_vec;
using kernel::sum_lanes;
using kernel::sum_lanes_vec;
using kernel::Vec;
using kernel::visit_floats;

namespace {

// Logits per step of the backward's write loop, staged through a local buffer so that
// dlogits may alias logits and the loop still vectorises.
constexpr int64_t kChunk = 256;

// logits (..., V); targets i32 with logits' leading dimensions. Returns V. Every target must
// be a class index or ignore_index: checked before any parallel work starts.
int64_t expect_logits_and_targets(const Tensor& logits, const Tensor& targets, int32_t ignore_index,
                                  std::string_view op) {
  expect_float_dtype(logits, op, "logits");
  expect_dtype(targets, DType::kI32, op, "targets");
  if (logits.rank() < 2) {
    LATTICE_THROW(ShapeError, "{}: 'logits' has shape {}, expected (N, V)", op,
                  logits.shape().to_string());
  }
  std::vector<int64_t> leading(logits.shape().dims().begin(), logits.shape().dims().end() - 1);
  expect_shape(targets, Shape(leading), op, "targets");
  const int64_t vocab = logits.dim(-1);
  const int32_t* t = targets.data<int32_t>();
  for (int64_t n = 0; n < targets.numel(); ++n) {
    if (t[n] == ignore_index) continue;
    if (t[n] < 0 || t[n] >= vocab) {
      LATTICE_THROW(ValueError,
                    "{}: targets[{}] = {} is outside [0, {}) and is not the ignore index {} "
                    "---> HINT: check the tokenizer's vocabulary size against the model's V",
                    op, n, t[n], vocab, ignore_index);
    }
  }
  return vocab;
}

struct RowStats {
  float max;
  float sum;  // Σ exp(x - max) ≥ 1
};

// Σ exp(x[v] − max) over v < count, f32 logits on vectors (kernels/simd.h: the same bits).
// The vector term is always inlined: under TSan GCC otherwise calls a clone of it that returns
// the 64-byte Vec, which without AVX-512 is -Wpsabi's ABI change, at no line simd.h's pragma
// covers.
float sum_exp_of(const float* x, int64_t count, float max) {
  return sum_lanes_vec(
      count,
      [&](int64_t v) __attribute__((always_inline)) { return exp_vec(load_vec(x + v) - max); },
      [&](int64_t v) { return exp_fast(x[v] - max); });
}
float sum_exp_of(const bf16* x, int64_t count, float max) {
  return sum_lanes(count, [&](int64_t v) { return exp_fast(load(x[v]) - max); });
}

template <class T>
RowStats row_stats_of(const T* x, int64_t vocab) {
  const float m = max_lanes(vocab, [&](int64_t v) { return load(x[v]); });
  return {m, sum_exp_of(x, vocab, m)};
}

// row_stats (2, N) f32 for `rows` rows of logits, or undefined.
void expect_row_stats(const Tensor& row_stats, int64_t rows, std::string_view op) {
  if (!row_stats.defined()) return;
  expect_dtype(row_stats, DType::kF32, op, "row_stats");
  expect_shape(row_stats, {2, rows}, op, "row_stats");
}

void expect_gradient_output(const Tensor& dlogits, const Tensor& logits, std::string_view op) {
  expect_float_dtype(dlogits, op, "dlogits");
  expect_same_shape(dlogits, logits, op, "dlogits", "logits");
  if (dlogits.raw_data() == logits.raw_data() && dlogits.dtype() != logits.dtype()) {
    LATTICE_THROW(ValueError, "{}: 'dlogits' aliases 'logits' but has dtype {} instead of {}", op,
                  dtype_name(dlogits.dtype()), dtype_name(logits.dtype()));
  }
}

// dr = (exp(x - max) / sum - onehot(target)) · scale for one row. Values are staged through a
// local buffer so dr may alias xr; every operand is a local so the select vectorises.
template <class D, class X>
void write_row_gradient(D* dr, const X* xr, int64_t vocab, int64_t target, RowStats st,
                        float scale) {
  const float k = scale / st.sum;
  const float max = st.max;
  for (int64_t v0 = 0; v0 < vocab; v0 += kChunk) {
    const int64_t count = std::min(kChunk, vocab - v0);
    float staged[kChunk];
    for (int64_t i = 0; i < count; ++i) staged[i] = load(xr[v0 + i]);
    const int64_t local_target = target - v0;
    int64_t i = 0;
    for (; i + kVecLanes <= count; i += kVecLanes) {  // vectors, the scalar loop's bits
      Vec onehot{};
      if (local_target >= i && local_target < i + kVecLanes) onehot[local_target - i] = scale;
      store_vec(staged + i, exp_vec(load_vec(staged + i) - max) * k - onehot);
    }
    for (; i < count; ++i) {
      const float onehot = i == local_target ? scale : 0.0f;
      staged[i] = exp_fast(staged[i] - max) * k - onehot;
    }
    // Rounded to D in a loop of its own, which vectorises for bf16 as well.
    for (int64_t i = 0; i < count; ++i) dr[v0 + i] = store_as<D>(staged[i]);
  }
}

// The rows of a backward's gradient: (exp(x - max) / sum - onehot) · scale on each row's first
// `valid` of `width` columns and 0 after them (a slice's padding), 0 on rows whose target is
// ignored. `stats(n, xr)` gives row n's max and sum; targets are global, the slice starts at
// class vocab_start.
template <class D, class X, class Stats>
void write_gradient_rows(D* d, const X* x, const int32_t* t, int64_t rows, int64_t width,
                         int64_t valid, int64_t vocab_start, int32_t ignore_index, float scale,
                         Stats stats) {
  LATTICE_PARALLEL_FOR(rows * width)
  for (int64_t n = 0; n < rows; ++n) {
    D* dr = d + n * width;
    const X* xr = x + n * width;
    if (t[n] == ignore_index) {
      for (int64_t v = 0; v < width; ++v) dr[v] = store_as<D>(0.0f);
      continue;
    }
    write_row_gradient(dr, xr, valid, int64_t(t[n]) - vocab_start, stats(n, xr), scale);
    for (int64_t v = valid; v < width; ++v) dr[v] = store_as<D>(0.0f);
  }
}

}  // namespace

int64_t cross_entropy_forward(Tensor& losses, const Tensor& logits, const Tensor& targets,
                              int32_t ignore_index, Tensor row_stats) {
  const KernelTimer timer("cross-entropy fwd", 0, kernel::bytes_of({&losses, &logits}));
  constexpr std::string_view kOp = "cross_entropy_forward";
  const int64_t vocab = expect_logits_and_targets(logits, targets, ignore_index, kOp);
  expect_dtype(losses, DType::kF32, kOp, "losses");
  expect_shape(losses, targets.shape(), kOp, "losses");
  const int64_t rows = targets.numel();
  expect_row_stats(row_stats, rows, kOp);
  const int32_t* t = targets.data<int32_t>();
  float* loss = losses.data<float>();
  float* kept_max = row_stats.defined() ? row_stats.data<float>() : nullptr;
  float* kept_sum = kept_max != nullptr ? kept_max + rows : nullptr;
  visit_floats(
      [&](auto* x) {
        LATTICE_PARALLEL_FOR(rows * vocab)
        for (int64_t n = 0; n < rows; ++n) {
          if (t[n] == ignore_index) {
            loss[n] = 0.0f;
            continue;
          }
          const auto* xr = x + n * vocab;
          const RowStats st = row_stats_of(xr, vocab);
          if (kept_max != nullptr) {
            kept_max[n] = st.max;
            kept_sum[n] = st.sum;
          }
          // -log softmax[target] = log Σ exp(x - max) + max - x[target]
          loss[n] = std::log(st.sum) + (st.max - load(xr[t[n]]));
        }
      },
      logits);
  int64_t counted = 0;
  for (int64_t n = 0; n < rows; ++n) counted += t[n] != ignore_index;
  return counted;
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                            float scale, int32_t ignore_index, const Tensor& row_stats) {
  const KernelTimer timer("cross-entropy bwd", 0, kernel::bytes_of({&dlogits, &logits}));
  constexpr std::string_view kOp = "cross_entropy_backward";
  const int64_t vocab = expect_logits_and_targets(logits, targets, ignore_index, kOp);
  expect_gradient_output(dlogits, logits, kOp);
  const int64_t rows = targets.numel();
  expect_row_stats(row_stats, rows, kOp);
  const float* kept_max = row_stats.defined() ? row_stats.data<float>() : nullptr;
  const float* kept_sum = kept_max != nullptr ? kept_max + rows : nullptr;
  const int32_t* t = targets.data<int32_t>();
  visit_floats(
      [&](auto* d, auto* x) {
        write_gradient_rows(d, x, t, rows, vocab, vocab, 0, ignore_index, scale,
                            [&](int64_t n, const auto* xr) {
                              return kept_max != nullptr ? RowStats{kept_max[n], kept_sum[n]}
                                                         : row_stats_of(xr, vocab);
                            });
      },
      dlogits, logits);
}

}  // namespace lattice

namespace lattice {

namespace {

void expect_slice(const Tensor& logits, const Tensor& targets, int64_t valid, std::string_view op) {
  expect_dtype(logits, DType::kF32, op, "logits");
  expect_rank(logits, 2, op, "logits");
  expect_dtype(targets, DType::kI32, op, "targets");
  expect_shape(targets, {logits.dim(0)}, op, "targets");
  if (valid < 0 || valid > logits.dim(1)) {
    LATTICE_THROW(ValueError, "{}: {} valid columns of logits {}", op, valid,
                  logits.shape().to_string());
  }
}

}  // namespace

void cross_entropy_slice_max(Tensor& row_max, const Tensor& logits, int64_t valid) {
  const KernelTimer timer("cross-entropy (vocab-parallel) max", 0, kernel::bytes_of({&logits}));
  constexpr std::string_view kOp = "cross_entropy_slice_max";
  expect_dtype(logits, DType::kF32, kOp, "logits");
  expect_rank(logits, 2, kOp, "logits");
  expect_dtype(row_max, DType::kF32, kOp, "row_max");
  expect_shape(row_max, {logits.dim(0)}, kOp, "row_max");
  const int64_t rows = logits.dim(0), width = logits.dim(1);
  const float* x = logits.data<float>();
  float* m = row_max.data<float>();
  LATTICE_PARALLEL_FOR(rows * valid)
  for (int64_t n = 0; n < rows; ++n) {
    const float* xr = x + n * width;
    m[n] = valid == 0 ? -std::numeric_limits<float>::infinity()
                      : max_lanes(valid, [&](int64_t v) { return xr[v]; });
  }
}

void cross_entropy_slice_sums(Tensor& sums, const Tensor& logits, const Tensor& targets,
                              const Tensor& row_max, int64_t vocab_start, int64_t valid,
                              int32_t ignore_index) {
  const KernelTimer timer("cross-entropy (vocab-parallel) sums", 0, kernel::bytes_of({&logits}));
  constexpr std::string_view kOp = "cross_entropy_slice_sums";
  expect_slice(logits, targets, valid, kOp);
  const int64_t rows = logits.dim(0), width = logits.dim(1);
  expect_shape(sums, {2, rows}, kOp, "sums");
  expect_shape(row_max, {rows}, kOp, "row_max");
  const float* x = logits.data<float>();
  const float* m = row_max.data<float>();
  const int32_t* t = targets.data<int32_t>();
  float* sum_exp = sums.data<float>();
  float* target_logit = sum_exp + rows;
  LATTICE_PARALLEL_FOR(rows * valid)
  for (int64_t n = 0; n < rows; ++n) {
    const float* xr = x + n * width;
    const float max = m[n];
    sum_exp[n] = valid == 0 ? 0.0f : sum_exp_of(xr, valid, max);
    const int64_t local = int64_t(t[n]) - vocab_start;
    target_logit[n] = t[n] != ignore_index && local >= 0 && local < valid ? xr[local] : 0.0f;
  }
}

void cross_entropy_slice_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                                  const Tensor& row_max, const Tensor& row_sum, int64_t vocab_start,
                                  int64_t valid, float scale, int32_t ignore_index) {
  const KernelTimer timer("cross-entropy (vocab-parallel) bwd", 0,
                          kernel::bytes_of({&dlogits, &logits}));
  constexpr std::string_view kOp = "cross_entropy_slice_backward";
  expect_slice(logits, targets, valid, kOp);
  expect_gradient_output(dlogits, logits, kOp);
  const int64_t rows = logits.dim(0), width = logits.dim(1);
  expect_shape(row_max, {rows}, kOp, "row_max");
  expect_shape(row_sum, {rows}, kOp, "row_sum");
  const float* x = logits.data<float>();
  const int32_t* t = targets.data<int32_t>();
  const float* m = row_max.data<float>();
  const float* s = row_sum.data<float>();
  visit_floats(
      [&](auto* d) {
        write_gradient_rows(d, x, t, rows, width, valid, vocab_start, ignore_index, scale,
                            [&](int64_t n, const float*) {
                              return RowStats{m[n], s[n]};
                            });
      },
      dlogits);
}

}  // namespace lattice
