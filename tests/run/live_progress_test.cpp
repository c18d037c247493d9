// The live progress between progress lines: the time left, the bar, and the rule every
// straggler report follows (core/statistics.h StragglerStreak).
#include <gtest/gtest.h>

#include "comm/thread_world.h"
#include "core/statistics.h"
#include "run/live_progress.h"

namespace lattice {
namespace {

TEST(LiveProgress, DurationsAndBarsReadAsAPersonWrites) {
  EXPECT_EQ(format_duration(12.4), "12s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(progress_bar(0, 10, 10), "[..........]");
  EXPECT_EQ(progress_bar(3, 10, 10), "[###.......]");
  EXPECT_EQ(progress_bar(10, 10, 10), "[##########]");
}

TEST(LiveProgress, TheTimeLeftIsTheMeanStepSoFarTimesTheStepsToGo) {
  run_ranks(1, [](Communicator& world) {
    LiveProgress live(/*first_step=*/10, /*total_steps=*/110, /*terminal=*/false,
                      /*straggler_factor=*/0);
    StepMetrics m;
    m.step = 11;
    EXPECT_EQ(live.eta_suffix(m), " | ETA 0s");  // nothing measured yet
    for (const double ms : {400.0, 600.0}) {     // a resumed run: steps 11 and 12, 0.5 s each
      m.ms = ms;
      live.after_step(m, world, /*line_follows=*/true);
      ++m.step;
    }
    --m.step;
    EXPECT_EQ(live.eta_suffix(m), " | ETA 49s");  // 98 steps to go at 0.5 s
    m.step = 110;
    EXPECT_EQ(live.eta_suffix(m), "");  // the last step
  });
}

TEST(StragglerStreak, ReportsOnceWhenARankIsSlowForThreeStepsInARow) {
  StragglerStreak streak;
  EXPECT_FALSE(streak.observe(70, 30, 1.5));
  EXPECT_FALSE(streak.observe(70, 30, 1.5));
  EXPECT_FALSE(streak.observe(40, 30, 1.5));  // not slow enough: the run starts over
  EXPECT_EQ(streak.length(), 0);
  EXPECT_FALSE(streak.observe(70, 30, 1.5));
  EXPECT_FALSE(streak.observe(70, 30, 1.5));
  EXPECT_TRUE(streak.observe(70, 30, 1.5));
  EXPECT_FALSE(streak.observe(70, 30, 1.5));  // once
  EXPECT_EQ(streak.length(), 4);
}

}  // namespace
}  // namespace lattice
