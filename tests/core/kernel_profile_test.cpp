// The kernel profile (core/kernel_profile.h): timers book their calls, FLOPs and bytes into the
// thread's installed profile, only the outermost of nested timers counts, and without a profile
// nothing is recorded.
#include "core/kernel_profile.h"

#include <gtest/gtest.h>

#include <thread>

namespace lattice {
namespace {

TEST(KernelProfile, TimersBookIntoTheInstalledProfileAndNestedOnesCountOnce) {
  KernelProfile profile;
  {
    const KernelTimer outside("before", 1, 1);  // no profile installed yet: not booked
  }
  {
    const ScopedKernelProfile scope(profile);
    for (int i = 0; i < 3; ++i) {
      const KernelTimer outer("attention fwd", 100, 10);
      const KernelTimer inner("gemm (other)", 50, 5);  // inside attention: its time is attention's
    }
    const KernelTimer copy("copy", 0, 64);
  }
  const KernelTimer after("after", 1, 1);
  ASSERT_EQ(profile.totals().size(), 2u);
  const KernelTotals& attention = profile.totals().find("attention fwd")->second;
  EXPECT_EQ(attention.calls, 3);
  EXPECT_EQ(attention.flops, 300);
  EXPECT_EQ(attention.bytes, 30);
  EXPECT_GE(attention.seconds, 0);
  EXPECT_EQ(profile.totals().find("copy")->second.bytes, 64);
  EXPECT_FALSE(profile.totals().contains("gemm (other)"));
}

TEST(KernelProfile, EachThreadBooksIntoItsOwnProfile) {
  KernelProfile mine, theirs;
  const ScopedKernelProfile scope(mine);
  std::thread other([&] {
    const ScopedKernelProfile inner(theirs);
    const KernelTimer t("other thread", 1, 0);
  });
  other.join();
  { const KernelTimer t("this thread", 1, 0); }
  EXPECT_TRUE(mine.totals().contains("this thread"));
  EXPECT_FALSE(mine.totals().contains("other thread"));
  EXPECT_TRUE(theirs.totals().contains("other thread"));
}

}  // namespace
}  // namespace lattice
