// The cache-line round trip between two CPUs (core/core_latency.h): a positive, bounded figure
// for two CPUs the process may use, 0 — not a hang — for one it may not, and the caller's CPU
// mask as it was afterwards.
#include "core/core_latency.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/thread_budget.h"

namespace lattice {
namespace {

TEST(CoreLatency, TwoCpusOfTheProcessHaveAPositiveBoundedRoundTrip) {
  const std::vector<int> cpus = affinity_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU: nothing to measure between";
  const double ns = cache_line_round_trip_ns(cpus[0], cpus[1], 2000);
  EXPECT_GT(ns, 0.0);
  // Within a machine a round trip is well under a microsecond; 100 µs allows a descheduled
  // helper under a loaded test run without letting a broken measurement through.
  EXPECT_LT(ns, 1e5);
  EXPECT_EQ(affinity_cpus(), cpus) << "the caller's CPU mask is restored";
  const CpuDistance first = first_cpus_distance();  // what the benchmarks and the doctor print
  EXPECT_EQ(first.cpu_a, cpus[0]);
  EXPECT_EQ(first.cpu_b, cpus[1]);
  EXPECT_GT(first.ns, 0.0);
}

TEST(CoreLatency, TheSameCpuOrOneOutsideTheProcessIsNotMeasured) {
  const std::vector<int> cpus = affinity_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_EQ(cache_line_round_trip_ns(cpus[0], cpus[0]), 0.0);
  // CPU_SETSIZE − 1: no CPU of this machine; the helper cannot bind, and the call returns.
  EXPECT_EQ(cache_line_round_trip_ns(cpus[0], 1023, 2000, 5.0), 0.0);
  EXPECT_EQ(cache_line_round_trip_ns(1023, cpus[0], 2000, 5.0), 0.0);
  EXPECT_EQ(affinity_cpus(), cpus);
}

}  // namespace
}  // namespace lattice
