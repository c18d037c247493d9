// LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019) over the last dimension.
// Rows are independent: forward and the input gradient run one row per iteration in parallel.
// Parameter gradients sum over rows through fixed row blocks (partial sums per block, then the
// blocks in order), so they are bitwise identical for any thread count.
#include "kernels/normalization.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "kernels/kernel_support.h"

namespace lattice {

using kernel::Elem;
using kernel::F32View;
using kernel::load;
using kernel::store_as;
using kernel::sum_lanes;
using kernel::visit_floats;

namespace {

// Bounds the partial-sum workspace to kMaxBlocks × C floats per parameter gradient.
constexpr int64_t kMaxBlocks = 128;

// Validates an (N, C) activation and returns N; C is its last dimension.
int64_t expect_rows(const Tensor& t, std::string_view op, std::string_view what) {
  expect_float_dtype(t, op, what);
  if (t.rank() < 1 || t.dim(-1) == 0) {
    LATTICE_THROW(ShapeError, "{}: '{}' has shape {}, expected (N, C) with C > 0", op, what,
                  t.shape().to_string());
  }
  return kernel::rows_of(t);
}

// Saved statistics are f32 with one value per row: shape (N) or inp's leading dimensions.
void expect_row_stats(const Tensor& stats, const Tensor& inp, int64_t rows, std::string_view op,
                      std::string_view what) {
  expect_dtype(stats, DType::kF32, op, what);
  std::vector<int64_t> leading(inp.shape().dims().begin(), inp.shape().dims().end() - 1);
  if (stats.shape() != Shape{rows} && stats.shape() != Shape(leading)) {
    LATTICE_THROW(ShapeError, "{}: '{}' has shape {}, expected [{}] (one f32 per row of {})", op,
                  what, stats.shape().to_string(), rows, inp.shape().to_string());
  }
}

// The gradients both norms' backward take: dinp and dout shaped like inp (f32 or bf16), and
// dweight (width) f32.
void expect_backward_grads(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                           const Tensor& inp, int64_t width, std::string_view op) {
  expect_float_dtype(dinp, op, "dinp");
  expect_same_shape(dinp, inp, op, "dinp", "inp");
  expect_float_dtype(dout, op, "dout");
  expect_same_shape(dout, inp, op, "dout", "inp");
  expect_dtype(dweight, DType::kF32, op, "dweight");
  expect_shape(dweight, {width}, op, "dweight");
}

void expect_param(const Tensor& t, int64_t width, std::string_view op, std::string_view what) {
  expect_float_dtype(t, op, what);
  expect_shape(t, {width}, op, what);
}

// Runs block_fn(first_row, end_row, partials) over fixed row blocks in parallel, where
// partials[k] is a zeroed (C) buffer for the k-th parameter gradient; then adds the blocks'
// partials, in block order, into targets[k] (skipping null targets).
template <size_t K, class BlockFn>
void reduce_row_blocks(int64_t rows, int64_t width, const std::array<float*, K>& targets,
                       BlockFn&& block_fn) {
  const int64_t rows_per_block =
      std::max(kernel::kReductionRows, (rows + kMaxBlocks - 1) / kMaxBlocks);
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  std::vector<float> partial(size_t(blocks * width) * K, 0.0f);
  LATTICE_PARALLEL_FOR(rows * width)
  for (int64_t b = 0; b < blocks; ++b) {
    std::array<float*, K> mine;
    for (size_t k = 0; k < K; ++k) mine[k] = partial.data() + (size_t(b) * K + k) * width;
    block_fn(b * rows_per_block, std::min(rows, (b + 1) * rows_per_block), mine);
  }
  for (size_t k = 0; k < K; ++k) {
    float* target = targets[k];
    if (target == nullptr) continue;
    for (int64_t b = 0; b < blocks; ++b) {
      const float* p = partial.data() + (size_t(b) * K + k) * width;
      for (int64_t c = 0; c < width; ++c) target[c] += p[c];
    }
  }
}

// One row of the LayerNorm backward. __restrict: the gradients, inputs and partial sums are
// distinct buffers, which spares the vectoriser a runtime overlap check per pointer pair (too
// many pairs and it gives up on the f32 instantiation).
template <class DX, class DY, class X>
void layernorm_backward_row(DX* __restrict dx, const DY* __restrict dy, const X* __restrict x,
                            const float* __restrict w, float* __restrict dw, float* __restrict db,
                            int64_t width, float m, float s) {
  // dnorm = dy·w; dx = s·(dnorm - mean(dnorm) - norm·mean(dnorm·norm)).
  const float dnorm_mean =
      sum_lanes(width, [&](int64_t c) { return load(dy[c]) * w[c]; }) / float(width);
  const float dnorm_norm_mean =
      sum_lanes(width, [&](int64_t c) { return load(dy[c]) * w[c] * ((load(x[c]) - m) * s); }) /
      float(width);
  for (int64_t c = 0; c < width; ++c) {
    const float norm = (load(x[c]) - m) * s;
    const float g = load(dy[c]);
    dw[c] += g * norm;
    db[c] += g;
    const float grad = s * (g * w[c] - dnorm_mean - norm * dnorm_norm_mean);
    dx[c] = store_as<DX>(load(dx[c]) + grad);
  }
}

// One row of the RMSNorm backward: norm = x·s; dx = s·(dy·w - norm·mean(dy·w·norm)).
template <class DX, class DY, class X>
void rmsnorm_backward_row(DX* __restrict dx, const DY* __restrict dy, const X* __restrict x,
                          const float* __restrict w, float* __restrict dw, int64_t width, float s) {
  const float dnorm_norm_mean =
      sum_lanes(width, [&](int64_t c) { return load(dy[c]) * w[c] * (load(x[c]) * s); }) /
      float(width);
  for (int64_t c = 0; c < width; ++c) {
    const float norm = load(x[c]) * s;
    const float g = load(dy[c]);
    dw[c] += g * norm;
    dx[c] = store_as<DX>(load(dx[c]) + s * (g * w[c] - norm * dnorm_norm_mean));
  }
}

}  // namespace

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, float eps) {
  const KernelTimer timer("layernorm fwd", 0, kernel::bytes_of({&out, &inp}));
  constexpr std::string_view kOp = "layernorm_forward";
  const int64_t rows = expect_rows(inp, kOp, "inp");
  const int64_t width = inp.dim(-1);
  expect_float_dtype(out, kOp, "out");
  expect_same_shape(out, inp, kOp, "out", "inp");
  expect_row_stats(mean, inp, rows, kOp, "mean");
  expect_row_stats(rstd, inp, rows, kOp, "rstd");
  expect_param(weight, width, kOp, "weight");
  if (bias.defined()) expect_param(bias, width, kOp, "bias");
  if (!(eps > 0.0f)) LATTICE_THROW(ValueError, "{}: eps must be > 0, got {}", kOp, eps);

  F32View w(weight);
  F32View b(bias);
  const float* pw = w.data();
  const float* pb = b.data();
  float* pmean = mean.data<float>();
  float* prstd = rstd.data<float>();
  visit_floats(
      [&](auto* o, auto* x) {
        using O = Elem<decltype(o)>;
        LATTICE_PARALLEL_FOR(rows * width)
        for (int64_t r = 0; r < rows; ++r) {
          const auto* xr = x + r * width;
          O* orow = o + r * width;
          // Two passes (mean, then squared deviations): no cancellation for rows with a large
          // mean, unlike E[x²] - E[x]².
          float m = sum_lanes(width, [&](int64_t c) { return load(xr[c]); }) / float(width);
          float var = sum_lanes(width,
                                [&](int64_t c) {
                                  float d = load(xr[c]) - m;
                                  return d * d;
                                }) /
                      float(width);
          float s = 1.0f / std::sqrt(var + eps);
          pmean[r] = m;
          prstd[r] = s;
          if (pb != nullptr) {
            for (int64_t c = 0; c < width; ++c) {
              orow[c] = store_as<O>((load(xr[c]) - m) * s * pw[c] + pb[c]);
            }
          } else {
            for (int64_t c = 0; c < width; ++c)
              orow[c] = store_as<O>((load(xr[c]) - m) * s * pw[c]);
          }
        }
      },
      out, inp);
}

void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  const KernelTimer timer("layernorm bwd", 0, kernel::bytes_of({&dinp, &dout, &inp}));
  constexpr std::string_view kOp = "layernorm_backward";
  const int64_t rows = expect_rows(inp, kOp, "inp");
  const int64_t width = inp.dim(-1);
  expect_backward_grads(dinp, dweight, dout, inp, width, kOp);
  if (dbias.defined()) {
    expect_dtype(dbias, DType::kF32, kOp, "dbias");
    expect_shape(dbias, {width}, kOp, "dbias");
  }
  expect_param(weight, width, kOp, "weight");
  expect_row_stats(mean, inp, rows, kOp, "mean");
  expect_row_stats(rstd, inp, rows, kOp, "rstd");

  F32View w(weight);
  const float* pw = w.data();
  const float* pmean = mean.data<float>();
  const float* prstd = rstd.data<float>();
  std::array<float*, 2> targets = {dweight.data<float>(),
                                   dbias.defined() ? dbias.data<float>() : nullptr};
  visit_floats(
      [&](auto* dx, auto* dy, auto* x) {
        reduce_row_blocks(rows, width, targets, [&](int64_t first, int64_t end, auto& partials) {
          float* dw = partials[0];
          float* db = partials[1];
          for (int64_t r = first; r < end; ++r) {
            layernorm_backward_row(dx + r * width, dy + r * width, x + r * width, pw, dw, db, width,
                                   pmean[r], prstd[r]);
          }
        });
      },
      dinp, dout, inp);
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                     float eps) {
  const KernelTimer timer("rmsnorm fwd", 0, kernel::bytes_of({&out, &inp}));
  constexpr std::string_view kOp = "rmsnorm_forward";
  const int64_t rows = expect_rows(inp, kOp, "inp");
  const int64_t width = inp.dim(-1);
  expect_float_dtype(out, kOp, "out");
  expect_same_shape(out, inp, kOp, "out", "inp");
  expect_row_stats(rstd, inp, rows, kOp, "rstd");
  expect_param(weight, width, kOp, "weight");
  if (!(eps > 0.0f)) LATTICE_THROW(ValueError, "{}: eps must be > 0, got {}", kOp, eps);

  F32View w(weight);
  const float* pw = w.data();
  float* prstd = rstd.data<float>();
  visit_floats(
      [&](auto* o, auto* x) {
        using O = Elem<decltype(o)>;
        LATTICE_PARALLEL_FOR(rows * width)
        for (int64_t r = 0; r < rows; ++r) {
          const auto* xr = x + r * width;
          O* orow = o + r * width;
          float ms = sum_lanes(width,
                               [&](int64_t c) {
                                 float v = load(xr[c]);
                                 return v * v;
                               }) /
                     float(width);
          float s = 1.0f / std::sqrt(ms + eps);
          prstd[r] = s;
          for (int64_t c = 0; c < width; ++c) orow[c] = store_as<O>(load(xr[c]) * s * pw[c]);
        }
      },
      out, inp);
}

void rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd) {
  const KernelTimer timer("rmsnorm bwd", 0, kernel::bytes_of({&dinp, &dout, &inp}));
  constexpr std::string_view kOp = "rmsnorm_backward";
  const int64_t rows = expect_rows(inp, kOp, "inp");
  const int64_t width = inp.dim(-1);
  expect_backward_grads(dinp, dweight, dout, inp, width, kOp);
  expect_param(weight, width, kOp, "weight");
  expect_row_stats(rstd, inp, rows, kOp, "rstd");

  F32View w(weight);
  const float* pw = w.data();
  const float* prstd = rstd.data<float>();
  std::array<float*, 1> targets = {dweight.data<float>()};
  visit_floats(
      [&](auto* dx, auto* dy, auto* x) {
        reduce_row_blocks(rows, width, targets, [&](int64_t first, int64_t end, auto& partials) {
          float* dw = partials[0];
          for (int64_t r = first; r < end; ++r) {
            rmsnorm_backward_row(dx + r * width, dy + r * width, x + r * width, pw, dw, width,
                                 prstd[r]);
          }
        });
      },
      dinp, dout, inp);
}

}  // namespace lattice
