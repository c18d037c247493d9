// 16-float vectors for kernels whose loops the compiler does not vectorise well by itself
// (internal to the kernels, not part of their API): GCC/Clang vector extensions, one AVX-512
// register under -march=native and split into narrower registers by the compiler otherwise.
//
// exp_vec and sigmoid_vec compute kernel_support.h's exp_fast and sigmoid_fast lane by lane,
// bit for bit, so a loop may run its body on vectors and its tail on scalars and give the same
// bits as the scalar loop alone. Where the build has no AVX-512 the vector exp is the scalar one
// per lane.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/kernel_support.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__AVX512F__)  // GCC and Clang
// Without AVX-512 GCC and Clang note that passing 64-byte vectors by value has another ABI; these
// helpers are inlined into the kernels' own files, so no ABI is crossed.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace lattice::kernel {

inline constexpr int kVecLanes = 16;
using Vec = float __attribute__((vector_size(64)));

inline Vec load_vec(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_vec(float* p, Vec v) {
  std::memcpy(p, &v, sizeof v);
}

inline Vec splat(float x) {
#if defined(__AVX512F__)
  return Vec(_mm512_set1_ps(x));
#else
  return Vec{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
#endif
}

// acc + a·b, one fused multiply-add (vector extensions alone do not promise contraction).
inline Vec fma_vec(Vec a, Vec b, Vec acc) {
#if defined(__AVX512F__)
  return Vec(_mm512_fmadd_ps(__m512(a), __m512(b), __m512(acc)));
#else
  return a * b + acc;
#endif
}

// exp_fast on every lane: the same exp_reduce (kernel_support.h) on vectors, then 2^n in one
// VSCALEFPS, which rounds the exact p·2^n once, as exp_fast's two multiplications (an exact one,
// then a rounding one) do.
inline Vec exp_vec(Vec x) {
#if defined(__AVX512F__)
  Vec n;
  const Vec p = exp_reduce(x, n);
  // The masked form (all lanes): GCC 12 warns on the unmasked one's undefined pass-through.
  const Vec result = Vec(_mm512_maskz_scalef_ps(0xffff, __m512(p), __m512(n)));
  return x != x ? x : result;  // NaN stays NaN
#else
  Vec out;
  for (int i = 0; i < kVecLanes; ++i) out[i] = exp_fast(x[i]);
  return out;
#endif
}

// sigmoid_fast on every lane: 1 / (1 + e^-x).
inline Vec sigmoid_vec(Vec x) {
  return splat(1.0f) / (splat(1.0f) + exp_vec(-x));
}

// kernel_support.h's sum_lanes with its whole 16-element blocks on vectors: vec_term(i) holds
// term(i + j) in lane j, lane j sums what sum_lanes' accumulator j sums, in the same order, and
// the lanes are folded by the same halving tree, so the result has sum_lanes' bits.
template <class VecTerm, class Term>
float sum_lanes_vec(int64_t n, VecTerm&& vec_term, Term&& term) {
  static_assert(kVecLanes == kLanes, "one vector holds sum_lanes' accumulators");
  Vec acc{};
  int64_t i = 0;
  for (; i + kVecLanes <= n; i += kVecLanes) acc += vec_term(i);
  float lanes[kVecLanes];
  store_vec(lanes, acc);
  for (int j = 0; i < n; ++i, ++j) lanes[j] += term(i);
  for (int width = kVecLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0];
}

}  // namespace lattice::kernel
