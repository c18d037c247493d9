// The agent's stuck verdict (elastic/agent.h, stuck_limit_s): how long a rank may go without
// progress grows with the pace it has shown, within the progress timeout and half the
// collective deadline.
#include <gtest/gtest.h>

#include "elastic/agent.h"

namespace lattice {
namespace {

TEST(StuckLimit, ARankThatFinishedNoStepHasHalfTheCollectiveDeadline) {
  ElasticConfig e;  // progress timeout 2 s, factor 4
  EXPECT_DOUBLE_EQ(stuck_limit_s(e, 30.0, 0.0), 15.0);
  // Never below the progress timeout, however short the deadline.
  EXPECT_DOUBLE_EQ(stuck_limit_s(e, 3.0, 0.0), 2.0);
}

TEST(StuckLimit, AfterAStepItIsTheFactorTimesTheLongestGapWithinTheBounds) {
  ElasticConfig e;
  // A small model's gaps are milliseconds: the progress timeout, as before.
  EXPECT_DOUBLE_EQ(stuck_limit_s(e, 30.0, 0.004), 2.0);
  // A 124M-parameter model's head GEMM of 1.5 s: 6 s.
  EXPECT_DOUBLE_EQ(stuck_limit_s(e, 30.0, 1.5), 6.0);
  // Never past half the deadline: the waiting peers must not time out first.
  EXPECT_DOUBLE_EQ(stuck_limit_s(e, 30.0, 5.0), 15.0);
  e.progress_factor = 2.0;
  EXPECT_DOUBLE_EQ(stuck_limit_s(e, 30.0, 1.5), 3.0);
}

}  // namespace
}  // namespace lattice
