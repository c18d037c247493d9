// This machine's arithmetic peaks on one core, measured rather than looked up: the denominator
// of model-FLOPs utilisation (MFU) and of every benchmark's "fraction of peak" (clock boost,
// AVX-512 down-clocking and double-pumped 512-bit units on AMD Zen 4 all move the paper figure).
// The single home of these loops: the trainer and the benchmarks both use them.
#pragma once

#include <cstdint>

namespace lattice {

// Independent accumulator chains per loop: an FMA has a latency of about 4 cycles and up to 2
// issue per cycle, so at least 8 chains must be in flight to keep both pipes busy; 16 leave
// headroom and still fit in the 32 zmm registers.
inline constexpr int kPeakChains = 16;

bool has_avx512_fma();   // the CPU runs fp32_fma_loop
bool has_avx512_bf16();  // the CPU runs bf16_dot_loop
bool has_amx_bf16();     // the CPU has AMX tiles with bf16 (cpuid; no loop here measures them)

// FLOPs of `repeats` rounds of kPeakChains fp32 FMAs on 16 lanes (an FMA is 2 FLOPs).
inline double fp32_fma_flops(int64_t repeats) {
  return 2.0 * 16 * kPeakChains * double(repeats);
}

// Runs the fp32 AVX-512 FMA loop from `start`; returns a value derived from every chain so the
// compiler cannot drop any of them. acc = acc * 0.999999 + 1e-6 stays near 1 (its fixed point).
// Benchmarks hide `start` from the optimiser (benchmark::DoNotOptimize). Compiled for AVX-512
// whatever the build flags; call it only when has_avx512_fma().
float fp32_fma_loop(float start, int64_t repeats);

// FLOPs of `repeats` rounds of kPeakChains VDPBF16PS: 16 lanes, each 2 bf16 products and 2 adds.
inline double bf16_dot_flops(int64_t repeats) {
  return 4.0 * 16 * kPeakChains * double(repeats);
}

// The AVX512-BF16 dot-product loop (VDPBF16PS), the bf16 peak of a CPU without AMX. The products
// of each bf16 pair cancel, so the accumulators stay at `start`. Call it only when
// has_avx512_bf16().
float bf16_dot_loop(float start, int64_t repeats);

// FLOP/s of one thread running the loops above for about `seconds` (best of 3, wall clock).
// Measured once per process and cached. fp32 falls back to a portable loop without AVX-512;
// bf16 is 0 without AVX512-BF16.
double measured_fp32_peak_flops_per_thread(double seconds = 0.05);
double measured_bf16_peak_flops_per_thread(double seconds = 0.05);

}  // namespace lattice
