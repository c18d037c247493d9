// This machine's arithmetic peaks, measured rather than looked up, so every benchmark can
// report its throughput as a fraction of what one core really does (clock boost, AVX-512
// down-clocking and double-pumped 512-bit units on AMD Zen 4 all move the paper figure).
//
// Each loop runs kChains independent accumulator chains: an FMA has a latency of about 4 cycles
// and up to 2 issue per cycle, so at least 8 chains must be in flight to keep both pipes busy;
// 16 chains leave headroom and still fit in the 32 zmm registers.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace lattice::bench {

inline constexpr int kChains = 16;

// Sum of the 16 lanes. (_mm512_reduce_add_ps trips GCC 12's -Wuninitialized in its own header.)
__attribute__((target("avx512f"))) inline float horizontal_sum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

// FLOPs of `repeats` rounds of kChains fp32 FMAs on 16 lanes (an FMA is 2 FLOPs).
inline double fp32_fma_flops(int64_t repeats) {
  return 2.0 * 16 * kChains * double(repeats);
}

// Runs the fp32 AVX-512 FMA loop from `start`; returns a value derived from every chain so the
// compiler cannot drop any of them. Callers hide `start` from the optimiser
// (benchmark::DoNotOptimize) so the loop cannot be hoisted out of a timing loop. acc = acc *
// 0.999999 + 1e-6 stays near 1 (its fixed point). Compiled for AVX-512 whatever the build flags;
// call it only when has_avx512_fma().
__attribute__((target("avx512f"))) inline float fp32_fma_loop(float start, int64_t repeats) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(start + 0.001f * float(c));
  const __m512 scale = _mm512_set1_ps(0.999999f);
  const __m512 offset = _mm512_set1_ps(1e-6f);
  for (int64_t r = 0; r < repeats; ++r) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], scale, offset);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return horizontal_sum(sum);
}

inline bool has_avx512_fma() {
  return __builtin_cpu_supports("avx512f");
}

// FLOPs of `repeats` rounds of kChains VDPBF16PS: 16 lanes, each 2 bf16 products and 2 adds.
inline double bf16_dot_flops(int64_t repeats) {
  return 4.0 * 16 * kChains * double(repeats);
}

// The AVX512-BF16 dot-product loop (VDPBF16PS), the bf16 peak of a CPU without AMX.
// Call it only when has_avx512_bf16().
__attribute__((target("avx512f,avx512bf16"))) inline float bf16_dot_loop(float start,
                                                                         int64_t repeats) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(start + 0.001f * float(c));
  // Each 32-bit lane holds a bf16 pair: x = (0.5, 0.5), y = (0.25, -0.25) (bits 0x3e80 and
  // 0xbe80), so the two products of a pair cancel and the accumulators never grow.
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f003f00);
  const __m512bh y = (__m512bh)_mm512_set1_epi32(int32_t(0xbe803e80u));
  for (int64_t r = 0; r < repeats; ++r) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], x, y);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return horizontal_sum(sum);
}

inline bool has_avx512_bf16() {
  return __builtin_cpu_supports("avx512bf16");
}

}  // namespace lattice::bench
