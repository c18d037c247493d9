// The kernels' internal vectorisable exp and lane-split reductions.
#include "kernels/kernel_support.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace lattice::kernel {
namespace {

TEST(ExpFast, RelativeErrorBelowThreeUlpOverTheNormalRange) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (float x = -87.0f; x <= 88.5f; x += 0.00731f) {
    const double exact = std::exp(double(x));
    const double error = std::abs(double(exp_fast(x)) - exact) / exact;
    if (error > worst) {
      worst = error;
      worst_x = x;
    }
  }
  // 3 ulp of fp32 = 3·2^-24 ≈ 1.8e-7.
  EXPECT_LT(worst, 1.8e-7) << "at x = " << worst_x;
}

TEST(ExpFast, LimitsAndSpecialValues) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_fast(0.0f), 1.0f);
  EXPECT_EQ(exp_fast(-kInf), 0.0f);
  EXPECT_EQ(exp_fast(-1000.0f), 0.0f);
  EXPECT_EQ(exp_fast(kInf), kInf);
  EXPECT_EQ(exp_fast(89.0f), kInf);
  EXPECT_TRUE(std::isnan(exp_fast(std::numeric_limits<float>::quiet_NaN())));
  // Gradual underflow: e^-100 ≈ 3.7e-44 is subnormal, not flushed.
  EXPECT_NEAR(exp_fast(-100.0f), std::exp(-100.0), 2e-45);
  EXPECT_GT(exp_fast(-100.0f), 0.0f);
}

TEST(LaneReductions, SumAndMaxMatchSerialLoopsForEveryTailLength) {
  for (int64_t n = 0; n < 70; ++n) {
    double serial = 0.0;
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      serial += double(i % 9) - 3.0;
      best = std::max(best, float((i * 37) % 101));
    }
    // Small integers: every partial sum is exact, so any order gives the serial result.
    EXPECT_EQ(sum_lanes(n, [](int64_t i) { return float(i % 9) - 3.0f; }), float(serial)) << n;
    EXPECT_EQ(max_lanes(n, [](int64_t i) { return float((i * 37) % 101); }), best) << n;
  }
}

}  // namespace
}  // namespace lattice::kernel
