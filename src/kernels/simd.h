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

// exp_fast on every lane, its operations in its order (the same expressions, contracted into
// the same fused multiply-adds); 2^n in one VSCALEFPS, which rounds the exact p·2^n once, as
// exp_fast's two multiplications (an exact one, then a rounding one) do.
inline Vec exp_vec(Vec x) {
#if defined(__AVX512F__)
  // Vector extensions where they say it, masked intrinsics (all lanes) where they cannot:
  // GCC 12 warns on the unmasked ones' undefined pass-through operand.
  constexpr __mmask16 kAll = 0xffff;
  Vec clamped = x > -104.0f ? x : splat(-104.0f);  // NaN → -104, as exp_fast
  clamped = clamped < 89.0f ? clamped : splat(89.0f);
  const Vec n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  Vec r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Vec p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const Vec result = Vec(_mm512_maskz_scalef_ps(kAll, __m512(p), __m512(n)));
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
