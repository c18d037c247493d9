#include "kernels/elementwise.h"

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

// Fixed chunking of a flat range for reductions: the chunk boundaries (and so the summation
// order) depend on the element count only, never on the thread count.
constexpr int64_t kMaxReductionChunks = 256;
constexpr int64_t kMinReductionChunk = 4096;

// Σ x² of p[0, n) in double with lane-split accumulators.
template <class T>
double sum_squares_span(const T* p, int64_t n) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      double v = double(load(p[i + j]));
      acc[j] += v * v;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    double v = double(load(p[i]));
    acc[j] += v * v;
  }
  double total = 0.0;
  for (double a : acc) total += a;
  return total;
}

// Checks that every tensor in `parts` has `inp`'s leading dimensions; returns Σ widths.
template <class TensorPtr>
int64_t check_parts(std::initializer_list<TensorPtr> parts, const Tensor& whole,
                    std::string_view op, std::string_view part_name, std::string_view whole_name) {
  expect_float_dtype(whole, op, whole_name);
  if (whole.rank() < 1) {
    LATTICE_THROW(ShapeError, "{}: '{}' must have rank >= 1, got {}", op, whole_name,
                  whole.shape().to_string());
  }
  std::vector<int64_t> leading(whole.shape().dims().begin(), whole.shape().dims().end() - 1);
  int64_t total = 0;
  int index = 0;
  for (const Tensor* part : parts) {
    std::string name = fmt::format("{}[{}]", part_name, index++);
    if (part == nullptr) LATTICE_THROW(ValueError, "{}: '{}' is a null pointer", op, name);
    expect_float_dtype(*part, op, name);
    if (part->rank() != whole.rank() ||
        !std::equal(leading.begin(), leading.end(), part->shape().dims().begin())) {
      LATTICE_THROW(ShapeError, "{}: '{}' has shape {}, expected leading dimensions of {} {}", op,
                    name, part->shape().to_string(), whole_name, whole.shape().to_string());
    }
    total += part->dim(-1);
  }
  if (total != whole.dim(-1)) {
    LATTICE_THROW(ShapeError, "{}: the widths of '{}' sum to {}, but '{}' {} has last dimension {}",
                  op, part_name, total, whole_name, whole.shape().to_string(), whole.dim(-1));
  }
  return total;
}

// Copies (or adds) `width` columns per row between two row-major matrices with different row
// strides and possibly different dtypes.
template <class Src, class Dst>
void copy_columns(const Src* src, int64_t src_stride, Dst* dst, int64_t dst_stride, int64_t rows,
                  int64_t width, bool accumulate) {
  LATTICE_PARALLEL_FOR(rows * width)
  for (int64_t r = 0; r < rows; ++r) {
    const Src* s = src + r * src_stride;
    Dst* d = dst + r * dst_stride;
    if (accumulate) {
      for (int64_t c = 0; c < width; ++c) d[c] = store_as<Dst>(load(d[c]) + load(s[c]));
    } else if constexpr (std::is_same_v<Src, Dst>) {
      std::memcpy(d, s, size_t(width) * sizeof(Dst));
    } else {
      for (int64_t c = 0; c < width; ++c) d[c] = store_as<Dst>(load(s[c]));
    }
  }
}

}  // namespace

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  const KernelTimer timer("add (residual)", 0, kernel::bytes_of({&out, &a, &b}));
  constexpr std::string_view kOp = "add";
  expect_float_dtype(out, kOp, "out");
  expect_float_dtype(a, kOp, "a");
  expect_float_dtype(b, kOp, "b");
  expect_same_shape(out, a, kOp, "out", "a");
  expect_same_shape(out, b, kOp, "out", "b");
  const int64_t n = out.numel();
  visit_floats(
      [n](auto* o, auto* pa, auto* pb) {
        using O = Elem<decltype(o)>;
        LATTICE_PARALLEL_FOR(n)
        for (int64_t i = 0; i < n; ++i) o[i] = store_as<O>(load(pa[i]) + load(pb[i]));
      },
      out, a, b);
}

void axpy(Tensor& y, float alpha, const Tensor& x) {
  const KernelTimer timer("axpy", 0, kernel::bytes_of({&y, &x}));
  constexpr std::string_view kOp = "axpy";
  expect_float_dtype(y, kOp, "y");
  expect_float_dtype(x, kOp, "x");
  expect_same_shape(y, x, kOp, "y", "x");
  const int64_t n = y.numel();
  visit_floats(
      [n, alpha](auto* py, auto* px) {
        using Y = Elem<decltype(py)>;
        LATTICE_PARALLEL_FOR(n)
        for (int64_t i = 0; i < n; ++i) py[i] = store_as<Y>(load(py[i]) + alpha * load(px[i]));
      },
      y, x);
}

void scale(Tensor& x, float alpha) {
  const KernelTimer timer("scale", 0, kernel::bytes_of({&x}));
  constexpr std::string_view kOp = "scale";
  expect_float_dtype(x, kOp, "x");
  const int64_t n = x.numel();
  visit_floats(
      [n, alpha](auto* px) {
        using X = Elem<decltype(px)>;
        LATTICE_PARALLEL_FOR(n)
        for (int64_t i = 0; i < n; ++i) px[i] = store_as<X>(alpha * load(px[i]));
      },
      x);
}

double sum_squares(const Tensor& x) {
  const KernelTimer timer("sum of squares (grad norm)", 0, kernel::bytes_of({&x}));
  expect_float_dtype(x, "sum_squares", "x");
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const int64_t chunks = std::clamp((n + kMinReductionChunk - 1) / kMinReductionChunk, int64_t(1),
                                    kMaxReductionChunks);
  const int64_t chunk = (n + chunks - 1) / chunks;
  double partial[kMaxReductionChunks] = {};
  visit_floats(
      [&](auto* px) {
        LATTICE_PARALLEL_FOR(n)
        for (int64_t c = 0; c < chunks; ++c) {
          int64_t begin = std::min(n, c * chunk);
          int64_t end = std::min(n, begin + chunk);
          partial[c] = sum_squares_span(px + begin, end - begin);
        }
      },
      x);
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c];
  return total;
}

void bias_forward(Tensor& out, const Tensor& bias) {
  const KernelTimer timer("bias fwd", 0, kernel::bytes_of({&out, &bias}));
  constexpr std::string_view kOp = "bias_forward";
  expect_dtype(out, DType::kF32, kOp, "out");
  expect_dtype(bias, DType::kF32, kOp, "bias");
  if (out.rank() < 1) {
    LATTICE_THROW(ShapeError, "{}: 'out' must have rank >= 1, got {}", kOp,
                  out.shape().to_string());
  }
  const int64_t width = out.dim(-1);
  expect_shape(bias, {width}, kOp, "bias");
  const int64_t rows = kernel::rows_of(out);
  float* o = out.data<float>();
  const float* b = bias.data<float>();
  LATTICE_PARALLEL_FOR(rows * width)
  for (int64_t n = 0; n < rows; ++n) {
    float* row = o + n * width;
    for (int64_t c = 0; c < width; ++c) row[c] += b[c];
  }
}

void bias_backward(Tensor& dbias, const Tensor& dout) {
  const KernelTimer timer("bias bwd", 0, kernel::bytes_of({&dbias, &dout}));
  constexpr std::string_view kOp = "bias_backward";
  expect_dtype(dbias, DType::kF32, kOp, "dbias");
  expect_float_dtype(dout, kOp, "dout");
  if (dout.rank() < 1) {
    LATTICE_THROW(ShapeError, "{}: 'dout' must have rank >= 1, got {}", kOp,
                  dout.shape().to_string());
  }
  const int64_t width = dout.dim(-1);
  expect_shape(dbias, {width}, kOp, "dbias");
  const int64_t rows = kernel::rows_of(dout);
  float* db = dbias.data<float>();
  // Parallel over column blocks: each column is summed over rows in order by one thread, so
  // the result does not depend on the thread count and needs no partial buffers.
  constexpr int64_t kColumnBlock = 64;
  const int64_t blocks = (width + kColumnBlock - 1) / kColumnBlock;
  visit_floats(
      [&](auto* pd) {
        LATTICE_PARALLEL_FOR(rows * width)
        for (int64_t block = 0; block < blocks; ++block) {
          int64_t begin = block * kColumnBlock;
          int64_t end = std::min(width, begin + kColumnBlock);
          float acc[kColumnBlock] = {};
          for (int64_t r = 0; r < rows; ++r) {
            const auto* row = pd + r * width;
            for (int64_t c = begin; c < end; ++c) acc[c - begin] += load(row[c]);
          }
          for (int64_t c = begin; c < end; ++c) db[c] += acc[c - begin];
        }
      },
      dout);
}

void split_last_dim(std::initializer_list<Tensor*> outs, const Tensor& inp) {
  const KernelTimer timer("split (copy)", 0, 2 * kernel::bytes_of({&inp}));
  constexpr std::string_view kOp = "split_last_dim";
  check_parts(outs, inp, kOp, "outs", "inp");
  const int64_t rows = kernel::rows_of(inp);
  const int64_t total = inp.dim(-1);
  int64_t offset = 0;
  for (Tensor* out : outs) {
    const int64_t width = out->dim(-1);
    visit_floats(
        [&](auto* src, auto* dst) {
          copy_columns(src + offset, total, dst, width, rows, width, /*accumulate=*/false);
        },
        inp, *out);
    offset += width;
  }
}

void concat_last_dim(Tensor& out, std::initializer_list<const Tensor*> inps, bool accumulate) {
  const KernelTimer timer("concat (copy)", 0, 2 * kernel::bytes_of({&out}));
  constexpr std::string_view kOp = "concat_last_dim";
  check_parts(inps, out, kOp, "inps", "out");
  const int64_t rows = kernel::rows_of(out);
  const int64_t total = out.dim(-1);
  int64_t offset = 0;
  for (const Tensor* inp : inps) {
    const int64_t width = inp->dim(-1);
    visit_floats(
        [&](auto* src, auto* dst) {
          copy_columns(src, width, dst + offset, total, rows, width, accumulate);
        },
        *inp, out);
    offset += width;
  }
}

}  // namespace lattice
