// matmul through oneDNN's matmul primitive (CPU engine, OpenMP runtime), or through oneMKL
// (matmul_mkl.cpp) when that library is chosen; the arguments are checked here for both.
//
// Transposes are expressed as strides in the memory descriptors, never as copies: a stored
// (K, M) is described as a logical (M, K) with strides (1, M). `accumulate` is a sum post-op,
// which makes oneDNN read out and add the product in fp32 before the single rounding to out's
// dtype. Prepared primitives live in a per-thread cache keyed by the full problem, including the
// thread's OpenMP team size, because oneDNN picks its blocking for that many threads at creation.
#include "kernels/matmul.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <unordered_map>
#include <vector>

#include "core/kernel_profile.h"
#include "core/thread_budget.h"
#include "kernels/matmul_mkl.h"

#if defined(LATTICE_USE_OPENMP)
#include <omp.h>
#endif

namespace lattice {

namespace {

constexpr std::string_view kOp = "matmul";

// The process-wide library choice (set_gemm_library).
std::atomic<GemmLibrary> chosen_library{GemmLibrary::kOneDnn};

// Distinct problems a thread keeps prepared. A dense training step uses a few dozen, a sparse
// one a few hundred (each expert's rows come in a few sizes per octave); the cap only bounds
// memory if a caller sweeps shapes (e.g. variable sequence lengths).
constexpr size_t kMaxCachedPrimitives = 1024;

// Everything that changes which primitive oneDNN builds: the cache key. The GEMM as posed
// (also what a profile books) and the threads it runs on.
struct Problem : GemmProblem {
  int threads = 1;

  bool operator==(const Problem&) const = default;
  std::string describe() const {
    return fmt::format(
        "M={} N={} K={} {}x{}->{} transpose_a={} transpose_b={} bias={} "
        "accumulate={} threads={}",
        m, n, k, dtype_name(input), dtype_name(input), dtype_name(output), transpose_a, transpose_b,
        bias, accumulate, threads);
  }
};

struct ProblemHash {
  size_t operator()(const Problem& p) const noexcept {
    size_t h = 0;
    auto mix = [&h](uint64_t v) {
      h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    mix(uint64_t(p.m));
    mix(uint64_t(p.n));
    mix(uint64_t(p.k));
    mix(uint64_t(p.transpose_a) | uint64_t(p.transpose_b) << 1 | uint64_t(p.bias) << 2 |
        uint64_t(p.accumulate) << 3 | uint64_t(p.input) << 8 | uint64_t(p.output) << 16);
    mix(uint64_t(p.threads));
    return h;
  }
};

struct PreparedMatmul {
  dnnl::matmul primitive;
  std::string implementation;  // primitive_desc::impl_info_str(), e.g. "brg:avx512_core_amx"
  // The CPU has no bf16 matmul (oneDNN's needs AVX-512): the primitive is f32, and the bf16
  // operands are widened exactly to f32 before it runs (the output rounded once after).
  bool widened = false;
};

dnnl::engine& cpu_engine() {
  // Engines are thread-safe; one per process serves every rank thread.
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Each rank thread has its own stream and primitives, so concurrent calls share no mutable
// state (oneDNN primitives may be executed concurrently, but the OpenMP team size they were
// tuned for is per thread anyway).
struct ThreadCache {
  dnnl::stream stream{cpu_engine()};
  std::unordered_map<Problem, PreparedMatmul, ProblemHash> primitives;
  MatmulCacheStats stats;
  std::vector<float> widened_a, widened_b, widened_out;  // widened bf16 (PreparedMatmul)
};

ThreadCache& thread_cache() {
  thread_local ThreadCache cache;
  return cache;
}

int current_threads() {
#if defined(LATTICE_USE_OPENMP)
  return omp_get_max_threads();
#else
  return thread_budget();
#endif
}

dnnl::memory::data_type dnnl_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return dnnl::memory::data_type::f32;
    case DType::kBF16:
      return dnnl::memory::data_type::bf16;
    default:
      LATTICE_THROW(ContractError, "matmul: no oneDNN type for dtype {}", dtype_name(dtype));
  }
}

// A logical (rows, cols) matrix stored row-major as (rows, cols), or, when `transposed`, stored
// row-major as (cols, rows): the transpose is only a change of strides.
dnnl::memory::desc matrix_desc(int64_t rows, int64_t cols, DType dtype, bool transposed) {
  dnnl::memory::dims strides =
      transposed ? dnnl::memory::dims{1, rows} : dnnl::memory::dims{cols, 1};
  return dnnl::memory::desc({rows, cols}, dnnl_dtype(dtype), strides);
}

PreparedMatmul create_matmul(const Problem& p) {
  dnnl::memory::desc a_md = matrix_desc(p.m, p.k, p.input, p.transpose_a);
  dnnl::memory::desc b_md = matrix_desc(p.k, p.n, p.input, p.transpose_b);
  dnnl::memory::desc out_md = matrix_desc(p.m, p.n, p.output, false);
  dnnl::primitive_attr attr;
  if (p.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);  // out = 1.0 * out + a @ b, summed in fp32 before rounding
    attr.set_post_ops(ops);
  }
  try {
    auto desc =
        p.bias ? dnnl::matmul::desc(a_md, b_md, matrix_desc(1, p.n, DType::kF32, false), out_md)
               : dnnl::matmul::desc(a_md, b_md, out_md);
    dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    return PreparedMatmul{dnnl::matmul(pd), pd.impl_info_str()};
  } catch (const dnnl::error& e) {
    LATTICE_THROW(ContractError, "matmul: oneDNN cannot create a primitive for {}: {}",
                  p.describe(), e.what());
  }
}

// Whether oneDNN has a bf16 matmul on this CPU (AVX-512 BF16, AMX, or AVX-512 emulation);
// asked once per process.
bool cpu_has_bf16_matmul() {
  static const bool has = [] {
    try {
      dnnl::memory::desc md = matrix_desc(16, 16, DType::kBF16, false);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), cpu_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return has;
}

PreparedMatmul create_widened_matmul(const Problem& p) {
  Problem f32 = p;
  f32.input = DType::kF32;
  f32.output = DType::kF32;
  PreparedMatmul prepared = create_matmul(f32);
  prepared.implementation += " (bf16 widened to f32: no bf16 matmul on this CPU)";
  prepared.widened = true;
  return prepared;
}

const PreparedMatmul& prepared_matmul(const Problem& problem) {
  ThreadCache& cache = thread_cache();
  auto it = cache.primitives.find(problem);
  if (it != cache.primitives.end()) {
    ++cache.stats.hits;
    return it->second;
  }
  if (cache.primitives.size() >= kMaxCachedPrimitives) cache.primitives.clear();
  PreparedMatmul prepared = problem.input == DType::kBF16 && !cpu_has_bf16_matmul()
                                ? create_widened_matmul(problem)
                                : create_matmul(problem);
  ++cache.stats.created;
  return cache.primitives.emplace(problem, std::move(prepared)).first->second;
}

void expect_dtype_pair(DType input, DType output) {
  bool allowed = (input == DType::kF32 && output == DType::kF32) ||
                 (input == DType::kBF16 && (output == DType::kF32 || output == DType::kBF16));
  if (!allowed) {
    LATTICE_THROW(DTypeError,
                  "matmul: 'out' has dtype {} for {} inputs; allowed are f32 x f32 -> f32 and "
                  "bf16 x bf16 -> f32 or bf16",
                  dtype_name(output), dtype_name(input));
  }
}

bool overlaps(const Tensor& x, const Tensor& y) {
  if (x.numel() == 0 || y.numel() == 0) return false;
  auto* x0 = static_cast<const std::byte*>(x.raw_data());
  auto* y0 = static_cast<const std::byte*>(y.raw_data());
  return x0 < y0 + y.nbytes() && y0 < x0 + x.nbytes();
}

// Checks every argument and returns the problem they describe.
Problem validate(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias,
                 const MatmulOptions& options) {
  expect_rank(a, 2, kOp, "a");
  expect_rank(b, 2, kOp, "b");
  expect_rank(out, 2, kOp, "out");
  expect_float_dtype(a, kOp, "a");
  expect_dtype(b, a.dtype(), kOp, "b");
  expect_dtype_pair(a.dtype(), out.dtype());

  Problem p;
  p.transpose_a = options.transpose_a;
  p.transpose_b = options.transpose_b;
  p.m = options.transpose_a ? a.dim(1) : a.dim(0);
  p.k = options.transpose_a ? a.dim(0) : a.dim(1);
  int64_t k_of_b = options.transpose_b ? b.dim(1) : b.dim(0);
  p.n = options.transpose_b ? b.dim(0) : b.dim(1);
  if (p.k != k_of_b) {
    LATTICE_THROW(ShapeError,
                  "matmul: inner dimensions differ: op('a') is ({}, {}) from {} with "
                  "transpose_a={}, op('b') is ({}, {}) from {} with transpose_b={} ---> HINT: "
                  "check the shapes and transpose flags",
                  p.m, p.k, a.describe(), options.transpose_a, k_of_b, p.n, b.describe(),
                  options.transpose_b);
  }
  expect_shape(out, Shape{p.m, p.n}, kOp, "out");
  if (bias.defined()) {
    if (options.accumulate) {
      LATTICE_THROW(ValueError,
                    "matmul: 'bias' cannot be combined with accumulate (out += a @ b would add "
                    "the bias once per call) ---> HINT: add the bias in one non-accumulating call");
    }
    expect_dtype(bias, DType::kF32, kOp, "bias");
    expect_shape(bias, Shape{p.n}, kOp, "bias");
  }
  if (overlaps(out, a) || overlaps(out, b)) {
    LATTICE_THROW(ValueError,
                  "matmul: 'out' shares memory with '{}'; oneDNN reads the inputs while writing "
                  "out ---> HINT: write into a separate tensor",
                  overlaps(out, a) ? "a" : "b");
  }
  p.input = a.dtype();
  p.output = out.dtype();
  p.bias = bias.defined();
  p.accumulate = options.accumulate;
  p.threads = current_threads();
  return p;
}

// K == 0: the product is the zero matrix, so out = bias (or 0), or unchanged when accumulating.
// oneDNN is not asked, as it has no implementation for empty reductions.
void write_empty_product(Tensor& out, const Tensor& bias, bool accumulate) {
  if (accumulate) return;
  if (!bias.defined()) {
    out.zero_();
    return;
  }
  int64_t n = out.dim(1);
  auto* row0 = static_cast<std::byte*>(out.raw_data());
  convert(bias.raw_data(), DType::kF32, row0, out.dtype(), n);
  size_t row_bytes = size_t(n) * dtype_size(out.dtype());
  for (int64_t i = 1; i < out.dim(0); ++i) std::memcpy(row0 + i * row_bytes, row0, row_bytes);
}

}  // namespace

void matmul(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias,
            MatmulOptions options) {
  Problem problem = validate(out, a, b, bias, options);
  // The model's GEMMs carry their role in an outer timer; this one books the others.
  const KernelTimer timer("gemm (other)",
                          2.0 * double(problem.m) * double(problem.n) * double(problem.k),
                          double(a.nbytes() + b.nbytes() + out.nbytes()));
  note_gemm_problem(problem);
  if (problem.m == 0 || problem.n == 0) return;
  if (problem.k == 0) {
    write_empty_product(out, bias, options.accumulate);
    return;
  }
  if (gemm_library() == GemmLibrary::kMkl) {
    mkl_gemm::run(problem, problem.threads, out, a, b, bias);
    return;
  }
  const PreparedMatmul& prepared = prepared_matmul(problem);
  dnnl::engine& engine = cpu_engine();
  // Widened bf16: f32 copies of the operands (and of a bf16 output) in per-thread scratch.
  const DType input = prepared.widened ? DType::kF32 : problem.input;
  const DType output = prepared.widened ? DType::kF32 : problem.output;
  const void* a_data = a.raw_data();
  const void* b_data = b.raw_data();
  void* out_data = out.raw_data();
  const bool widen_out = prepared.widened && problem.output == DType::kBF16;
  if (prepared.widened) {
    ThreadCache& cache = thread_cache();
    cache.widened_a.resize(size_t(a.numel()));
    cache.widened_b.resize(size_t(b.numel()));
    convert(a.raw_data(), DType::kBF16, cache.widened_a.data(), DType::kF32, a.numel());
    convert(b.raw_data(), DType::kBF16, cache.widened_b.data(), DType::kF32, b.numel());
    a_data = cache.widened_a.data();
    b_data = cache.widened_b.data();
    if (widen_out) {
      cache.widened_out.resize(size_t(out.numel()));
      if (problem.accumulate) {
        convert(out.raw_data(), DType::kBF16, cache.widened_out.data(), DType::kF32, out.numel());
      }
      out_data = cache.widened_out.data();
    }
  }
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(matrix_desc(problem.m, problem.k, input, problem.transpose_a),
                                  engine, const_cast<void*>(a_data))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(matrix_desc(problem.k, problem.n, input, problem.transpose_b),
                                      engine, const_cast<void*>(b_data))},
      {DNNL_ARG_DST,
       dnnl::memory(matrix_desc(problem.m, problem.n, output, false), engine, out_data)},
  };
  if (problem.bias) {
    args.emplace(DNNL_ARG_BIAS, dnnl::memory(matrix_desc(1, problem.n, DType::kF32, false), engine,
                                             bias.raw_data()));
  }
  dnnl::stream& stream = thread_cache().stream;
  try {
    prepared.primitive.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    LATTICE_THROW(ContractError, "matmul: oneDNN failed to execute {}: {}", problem.describe(),
                  e.what());
  }
  if (widen_out) convert(out_data, DType::kF32, out.raw_data(), DType::kBF16, out.numel());
}

std::string matmul_implementation(int64_t m, int64_t n, int64_t k, DType input, DType output,
                                  MatmulOptions options) {
  expect_dtype_pair(input, output);
  if (m <= 0 || n <= 0 || k <= 0) {
    LATTICE_THROW(ValueError,
                  "matmul_implementation: M={} N={} K={} has an empty dimension; no oneDNN "
                  "primitive runs for it",
                  m, n, k);
  }
  Problem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.transpose_a = options.transpose_a;
  p.transpose_b = options.transpose_b;
  p.input = input;
  p.output = output;
  p.accumulate = options.accumulate;
  p.threads = current_threads();
  if (gemm_library() == GemmLibrary::kMkl) return mkl_gemm::implementation(p);
  return prepared_matmul(p).implementation;
}

std::vector<GemmLibrary> available_gemm_libraries() {
  std::vector<GemmLibrary> libraries{GemmLibrary::kOneDnn};
  if (mkl_gemm::linked()) libraries.push_back(GemmLibrary::kMkl);
  return libraries;
}

std::string_view gemm_library_key(GemmLibrary library) {
  return library == GemmLibrary::kMkl ? "mkl" : "onednn";
}

GemmLibrary parse_gemm_library(std::string_view key) {
  if (key == "onednn") return GemmLibrary::kOneDnn;
  if (key == "mkl") {
    if (!mkl_gemm::linked()) {
      LATTICE_THROW(ValueError,
                    "gemm library 'mkl': this build has no oneMKL ---> HINT: run "
                    "scripts/setup.sh (it unpacks oneMKL from PyPI into .deps/) and build "
                    "again, or choose \"onednn\"");
    }
    return GemmLibrary::kMkl;
  }
  LATTICE_THROW(ValueError, "gemm library '{}' is not one of: onednn, mkl{}", key,
                mkl_gemm::linked() ? "" : " (mkl: not in this build)");
}

void set_gemm_library(GemmLibrary library) {
  if (library == GemmLibrary::kMkl && !mkl_gemm::linked()) {
    parse_gemm_library("mkl");  // throws the error that names the fix
  }
  chosen_library.store(library);
}

GemmLibrary gemm_library() {
  return chosen_library.load();
}

std::string gemm_library_name(GemmLibrary library) {
  if (library == GemmLibrary::kMkl) return mkl_gemm::library_name();
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
}

MatmulCacheStats matmul_cache_stats() {
  return thread_cache().stats;
}

std::string matmul_library_name() {
  return gemm_library_name(gemm_library());
}

void matmul_cache_clear() {
  ThreadCache& cache = thread_cache();
  cache.primitives.clear();
  cache.stats = {};
}

}  // namespace lattice
