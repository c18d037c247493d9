#include "core/cpu_peak.h"

#include <immintrin.h>

#include <mutex>

#include "core/timer.h"

namespace lattice {

namespace {

// 12 independent accumulator chains hide the FMA latency (4 cycles × 2 ports + slack).
double fma_loop(long iterations) {
#if defined(__AVX512F__)
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iterations; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_ps(sum, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  volatile float sink = lanes[0] + lanes[15];
  (void)sink;
  return double(iterations) * 12.0 * 16.0 * 2.0;
#elif defined(__AVX2__)
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < iterations; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  volatile float sink = acc[0][0] + acc[11][0];
  (void)sink;
  return double(iterations) * 12.0 * 8.0 * 2.0;
#else
  float acc[8] = {0};
  for (long it = 0; it < iterations; ++it) {
    for (int i = 0; i < 8; ++i) acc[i] = acc[i] * 0.999999f + 1e-7f;
  }
  volatile float sink = acc[0];
  (void)sink;
  return double(iterations) * 8.0 * 2.0;
#endif
}

}  // namespace

double measured_fp32_peak_flops_per_thread(double seconds) {
  static std::once_flag once;
  static double peak = 0.0;
  std::call_once(once, [&] {
    fma_loop(100000);  // warm up the vector units
    long iterations = 1 << 20;
    for (int attempt = 0; attempt < 3; ++attempt) {
      Stopwatch w;
      double flops = fma_loop(iterations);
      double s = w.seconds();
      peak = std::max(peak, flops / s);
      if (s < seconds) iterations = long(double(iterations) * seconds / std::max(s, 1e-6));
    }
  });
  return peak;
}

}  // namespace lattice
