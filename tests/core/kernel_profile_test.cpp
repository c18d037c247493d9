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

TEST(KernelProfile, GemmProblemsAreBookedUnderTheOutermostOpenTimer) {
  const GemmProblem qkv{.m = 1024, .k = 768, .n = 2304, .transpose_b = true};
  const GemmProblem dw{.m = 768, .k = 1024, .n = 2304, .transpose_a = true, .accumulate = true};
  KernelProfile profile;
  note_gemm_problem(qkv);  // not profiling: nothing to book into
  {
    const ScopedKernelProfile scope(profile);
    note_gemm_problem(qkv);  // no timer open: no kernel to book it under
    for (int i = 0; i < 2; ++i) {
      const KernelTimer role("gemm attn.c_attn fwd", qkv.flops(), 0);
      const KernelTimer inner("gemm (other)", qkv.flops(), 0);
      note_gemm_problem(qkv);
    }
    const KernelTimer role("gemm attn.c_attn dw", dw.flops(), 0);
    note_gemm_problem(dw);
  }
  ASSERT_TRUE(profile.totals().contains("gemm attn.c_attn fwd"));
  const auto& fwd = profile.totals().find("gemm attn.c_attn fwd")->second.gemm_problems;
  ASSERT_EQ(fwd.size(), 1u);
  EXPECT_EQ(fwd.begin()->first, qkv);
  EXPECT_EQ(fwd.begin()->second, 2);
  const auto& weight = profile.totals().find("gemm attn.c_attn dw")->second.gemm_problems;
  ASSERT_EQ(weight.size(), 1u);
  EXPECT_TRUE(weight.begin()->first.accumulate);
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
