// Matrix multiplication through oneDNN or, where the build has it, Intel oneMKL.
//
//   out (M, N) = op(a) @ op(b) [+ bias]   or, with accumulate, out += op(a) @ op(b)
//   op(a) = a (M, K) or aᵀ with a stored (K, M); op(b) = b (K, N) or bᵀ with b stored (N, K).
//
// a and b have the same dtype: f32, or bf16 with fp32 accumulation. out is f32, or bf16 when
// the inputs are bf16. bias (N) is f32 and may be undefined; it cannot be combined with
// accumulate. Primitives are created once per distinct problem and reused (a per-thread cache
// keyed by M, N, K, transposes, dtypes, bias, accumulate and the thread's OpenMP team size), so
// steady-state calls pay no creation cost. Any of M, N, K may be 0 (K == 0: out = bias or 0).
// Bad arguments raise ShapeError / DTypeError / ValueError naming matmul and the argument;
// out must not share memory with a or b.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace lattice {

struct MatmulOptions {
  bool transpose_a = false;
  bool transpose_b = false;
  bool accumulate = false;  // out += product (bias must be undefined)
};

void matmul(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias = Tensor(),
            MatmulOptions options = {});

// The GEMM libraries matmul can run: oneDNN, always there and the default, and Intel oneMKL in
// builds that found it (scripts/setup.sh unpacks it). Which one runs is one process-wide choice
// (train.gemm_library, lattice bench train --gemm-library); both round each output once from
// an fp32 sum, but not in the same order, so results differ between them in the last bits and
// are reproducible run to run within each.
enum class GemmLibrary { kOneDnn, kMkl };
// Those this build can run, oneDNN first.
std::vector<GemmLibrary> available_gemm_libraries();
// "onednn" or "mkl": the name configs and flags use.
std::string_view gemm_library_key(GemmLibrary library);
// The key back; ValueError naming the choices, or how to get oneMKL when this build lacks it.
GemmLibrary parse_gemm_library(std::string_view key);
// Every later matmul of every thread runs in `library` (ValueError when the build lacks it).
void set_gemm_library(GemmLibrary library);
GemmLibrary gemm_library();
// The library and its version, e.g. "oneDNN 2.6.3" or "oneMKL 2026.2".
std::string gemm_library_name(GemmLibrary library);

// The oneDNN implementation chosen for a problem (without bias), e.g. "brg:avx512_core_amx"
// on a CPU with AMX, or oneMKL's routine ("mkl:cblas_sgemm") when that is the library chosen —
// what the benchmarks report so a reader knows which code path ran. For oneDNN it
// prepares the problem in the calling thread's cache, so it counts in matmul_cache_stats().
// Throws DTypeError for a dtype pair matmul does not support, ValueError for an empty M, N or K.
std::string matmul_implementation(int64_t m, int64_t n, int64_t k, DType input, DType output,
                                  MatmulOptions options = {});

// The library matmul runs now and its version, e.g. "oneDNN 2.6.3", for benchmark reports.
std::string matmul_library_name();

// Primitive-cache statistics of the calling thread (created primitives vs cache hits).
struct MatmulCacheStats {
  int64_t created = 0;
  int64_t hits = 0;
};
MatmulCacheStats matmul_cache_stats();
// Drops the calling thread's prepared primitives and zeroes its statistics (tests and the
// first-call benchmark start from an empty cache with it).
void matmul_cache_clear();

}  // namespace lattice
