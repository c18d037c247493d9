// Matrix multiplication through oneDNN.
//
//   out (M, N) = op(a) @ op(b) [+ bias]   or, with accumulate, out += op(a) @ op(b)
//   op(a) = a (M, K) or aᵀ with a stored (K, M); op(b) = b (K, N) or bᵀ with b stored (N, K).
//
// a and b have the same dtype: f32, or bf16 with fp32 accumulation. out is f32, or bf16 when
// the inputs are bf16. bias (N) is f32 and may be undefined; it cannot be combined with
// accumulate. Primitives are created once per distinct problem and reused (a per-thread cache),
// so steady-state calls pay no creation cost.
#pragma once

#include <string>

#include "core/tensor.h"

namespace lattice {

struct MatmulOptions {
  bool transpose_a = false;
  bool transpose_b = false;
  bool accumulate = false;  // out += product (bias must be undefined)
};

void matmul(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias = Tensor(),
            MatmulOptions options = {});

// The oneDNN implementation chosen for a problem, e.g. "brg:avx512_core_amx" — what the
// benchmarks report so a reader knows which code path ran.
std::string matmul_implementation(int64_t m, int64_t n, int64_t k, DType input, DType output,
                                  MatmulOptions options = {});

// Primitive-cache statistics of the calling thread (created primitives vs cache hits).
struct MatmulCacheStats {
  int64_t created = 0;
  int64_t hits = 0;
};
MatmulCacheStats matmul_cache_stats();

}  // namespace lattice
