#include "train/lr_schedule.h"

#include <gtest/gtest.h>

namespace lattice {
namespace {

TEST(LrSchedule, WarmupThenCosineToTheFloor) {
  LrSchedule s{.max_lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 10, .decay_steps = 110};
  EXPECT_FLOAT_EQ(s.at(0), 1e-4f);
  EXPECT_FLOAT_EQ(s.at(9), 1e-3f);
  EXPECT_FLOAT_EQ(s.at(10), 1e-3f);
  EXPECT_NEAR(s.at(60), 5.5e-4f, 1e-9);  // halfway: the mean of max and min
  EXPECT_FLOAT_EQ(s.at(110), 1e-4f);
  EXPECT_FLOAT_EQ(s.at(500), 1e-4f);
  for (int step = 10; step < 110; ++step) EXPECT_GE(s.at(step), s.at(step + 1));
}

}  // namespace
}  // namespace lattice
