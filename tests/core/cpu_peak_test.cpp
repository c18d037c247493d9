#include "core/cpu_peak.h"

#include <gtest/gtest.h>

#include <cmath>

namespace lattice {
namespace {

TEST(CpuPeak, FlopCountsFollowTheLoopShape) {
  // 16 lanes × kPeakChains chains; an FMA is 2 FLOPs, a VDPBF16PS lane 4.
  EXPECT_EQ(fp32_fma_flops(1), 2.0 * 16 * kPeakChains);
  EXPECT_EQ(fp32_fma_flops(1000), 1000 * fp32_fma_flops(1));
  EXPECT_EQ(bf16_dot_flops(3), 2 * fp32_fma_flops(3));
}

// Each chain runs x ← s·x + b, so after r rounds x = x* + (x0 − x*)·s^r with x* = b / (1 − s).
// A loop that skipped rounds (or chains) would land far from this.
TEST(CpuPeak, Fp32LoopComputesTheRecurrence) {
  if (!has_avx512_fma()) GTEST_SKIP() << "no AVX-512 on this CPU";
  const int64_t repeats = 100000;
  const float start = 1001.0f;
  const double s = double(0.999999f), b = double(1e-6f);
  const double fixed_point = b / (1.0 - s);
  double expected = 0;
  for (int c = 0; c < kPeakChains; ++c) {
    const double x0 = double(start + 0.001f * float(c));
    expected += 16 * (fixed_point + (x0 - fixed_point) * std::pow(s, double(repeats)));
  }
  const float result = fp32_fma_loop(start, repeats);
  EXPECT_NEAR(result, expected, 1e-3 * expected);
  EXPECT_GT(std::abs(result - 16.0 * kPeakChains * start), 0.05 * expected);  // it did decay
}

TEST(CpuPeak, Bf16LoopProductsCancel) {
  if (!has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const float start = 2.0f;
  double expected = 0;
  for (int c = 0; c < kPeakChains; ++c) expected += 16 * double(start + 0.001f * float(c));
  EXPECT_NEAR(bf16_dot_loop(start, 1000), expected, 1e-3);
}

TEST(CpuPeak, MeasuredPeaksArePositiveAndCached) {
  const double fp32 = measured_fp32_peak_flops_per_thread(0.002);
  EXPECT_GT(fp32, 0);
  EXPECT_TRUE(std::isfinite(fp32));
  EXPECT_EQ(measured_fp32_peak_flops_per_thread(0.002), fp32);  // measured once per process
  const double bf16 = measured_bf16_peak_flops_per_thread(0.002);
  if (has_avx512_bf16()) {
    EXPECT_GT(bf16, 0);
  } else {
    EXPECT_EQ(bf16, 0);
  }
}

}  // namespace
}  // namespace lattice
