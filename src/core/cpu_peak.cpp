#include "core/cpu_peak.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <mutex>

#include "core/timer.h"

namespace lattice {

namespace {

// Sum of the 16 lanes. (_mm512_reduce_add_ps trips GCC 12's -Wuninitialized in its own header.)
__attribute__((target("avx512f"))) float horizontal_sum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

// The fallback without AVX-512: kPeakChains × 8 scalar chains that the compiler vectorises for
// whatever ISA the build targets. Returns the FLOPs it ran.
double portable_fma_loop(int64_t repeats) {
  float acc[kPeakChains][8];
  for (int c = 0; c < kPeakChains; ++c) std::fill_n(acc[c], 8, 1.0f + 0.001f * float(c));
  for (int64_t r = 0; r < repeats; ++r) {
    for (auto& chain : acc) {
      for (float& lane : chain) lane = lane * 0.999999f + 1e-6f;
    }
  }
  volatile float sink = acc[0][0] + acc[kPeakChains - 1][7];
  (void)sink;
  return 2.0 * 8 * kPeakChains * double(repeats);
}

// Best FLOP/s of 3 timed runs of `run(repeats) -> FLOPs`, growing `repeats` until a run lasts
// about `seconds`.
template <typename Run>
double best_flops_per_second(Run run, double seconds) {
  run(int64_t(1) << 14);  // warm up the vector units (they power up on first use)
  int64_t repeats = int64_t(1) << 16;
  double best = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    Stopwatch watch;
    const double flops = run(repeats);
    const double elapsed = std::max(watch.seconds(), 1e-9);
    best = std::max(best, flops / elapsed);
    if (elapsed < seconds) repeats = int64_t(double(repeats) * seconds / elapsed);
  }
  return best;
}

}  // namespace

bool has_avx512_fma() {
  return __builtin_cpu_supports("avx512f");
}

bool has_avx512_bf16() {
  return __builtin_cpu_supports("avx512bf16");
}

// clang 14 does not know "amx-bf16" for __builtin_cpu_supports, so this asks CPUID as GCC's
// runtime does: leaf 7 EDX bit 22 (AMX-BF16), counted only when the OS saves the tile state
// (OSXSAVE, leaf 1 ECX bit 27, and XCR0 bits 17 TILECFG and 18 TILEDATA).
bool has_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !((ecx >> 27) & 1u)) return false;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0u));
  constexpr unsigned kTileState = (1u << 17) | (1u << 18);
  if ((xcr0_low & kTileState) != kTileState) return false;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (edx >> 22) & 1u;
}

__attribute__((target("avx512f"))) float fp32_fma_loop(float start, int64_t repeats) {
  __m512 acc[kPeakChains];
  for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_set1_ps(start + 0.001f * float(c));
  const __m512 scale = _mm512_set1_ps(0.999999f);
  const __m512 offset = _mm512_set1_ps(1e-6f);
  for (int64_t r = 0; r < repeats; ++r) {
#pragma GCC unroll 16
    for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], scale, offset);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kPeakChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return horizontal_sum(sum);
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_loop(float start, int64_t repeats) {
  __m512 acc[kPeakChains];
  for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_set1_ps(start + 0.001f * float(c));
  // Each 32-bit lane holds a bf16 pair: x = (0.5, 0.5), y = (0.25, -0.25) (bits 0x3e80 and
  // 0xbe80), so the two products of a pair cancel and the accumulators never grow.
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f003f00);
  const __m512bh y = (__m512bh)_mm512_set1_epi32(int32_t(0xbe803e80u));
  for (int64_t r = 0; r < repeats; ++r) {
#pragma GCC unroll 16
    for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], x, y);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kPeakChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return horizontal_sum(sum);
}

double measured_fp32_peak_flops_per_thread(double seconds) {
  static std::once_flag once;
  static double peak = 0.0;
  std::call_once(once, [&] {
    if (!has_avx512_fma()) {
      peak = best_flops_per_second(portable_fma_loop, seconds);
      return;
    }
    peak = best_flops_per_second(
        [](int64_t repeats) {
          volatile float sink = fp32_fma_loop(1.0f, repeats);
          (void)sink;
          return fp32_fma_flops(repeats);
        },
        seconds);
  });
  return peak;
}

double measured_bf16_peak_flops_per_thread(double seconds) {
  static std::once_flag once;
  static double peak = 0.0;
  std::call_once(once, [&] {
    if (!has_avx512_bf16()) return;
    peak = best_flops_per_second(
        [](int64_t repeats) {
          volatile float sink = bf16_dot_loop(1.0f, repeats);
          (void)sink;
          return bf16_dot_flops(repeats);
        },
        seconds);
  });
  return peak;
}

}  // namespace lattice
