// The kernels' internal vectorisable exp and lane-split reductions, and their vector forms
// (kernels/simd.h), which must give the same bits.
#include "kernels/kernel_support.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/simd.h"

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

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// exp_vec on every lane is exp_fast, bit for bit: over the whole range, the clamps, underflow to
// subnormals and zero, overflow to infinity (a NaN stays a NaN).
TEST(ExpVec, GivesExpFastsBitsOnEveryLane) {
  std::vector<float> xs;
  for (float x = -120.0f; x <= 100.0f; x += 0.00377f) xs.push_back(x);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (float x :
       {0.0f, -0.0f, kInf, -kInf, 1e30f, -1e30f, -87.3f, -103.9f, -104.0f, 88.7f, 89.0f}) {
    xs.push_back(x);
  }
  while (xs.size() % kVecLanes != 0) xs.push_back(1.0f);
  int64_t differ = 0;
  for (size_t i = 0; i < xs.size(); i += kVecLanes) {
    float lanes[kVecLanes];
    store_vec(lanes, exp_vec(load_vec(xs.data() + i)));
    for (int j = 0; j < kVecLanes; ++j) {
      if (bits_of(lanes[j]) != bits_of(exp_fast(xs[i + size_t(j)]))) {
        if (++differ <= 5) ADD_FAILURE() << "exp of " << xs[i + size_t(j)] << ": " << lanes[j];
      }
    }
  }
  EXPECT_EQ(differ, 0);
  float nan[kVecLanes];
  store_vec(nan, exp_vec(splat(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(nan[0]));
}

// sum_lanes_vec sums what sum_lanes sums in the same order: the same bits for every length,
// on values whose partial sums round (unlike the small integers above).
TEST(LaneReductions, TheVectorSumHasTheScalarSumsBitsForEveryTailLength) {
  std::vector<float> values(300);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(float(i) * 0.731f) * 1e3f + 0.1f;
  for (int64_t n = 0; n <= int64_t(values.size()); ++n) {
    const float* x = values.data();
    const float scalar = sum_lanes(n, [&](int64_t i) { return x[i]; });
    const float vector = sum_lanes_vec(
        n, [&](int64_t i) { return load_vec(x + i); }, [&](int64_t i) { return x[i]; });
    EXPECT_EQ(bits_of(vector), bits_of(scalar)) << n;
  }
}

}  // namespace
}  // namespace lattice::kernel
