// How far apart two CPUs are, measured: the round trip of one cache line bounced between a
// thread on each. On one die it is tens of nanoseconds; across dies or sockets several times
// that, and kernels whose threads share memory slow down with it. On a virtual machine the host
// decides, and may change, where the virtual CPUs run: on the 2-core development VM the same two
// CPUs read 55 ns or 320 ns apart, flipping after both had idled, and a 2-thread training step
// took 26 or 37 ms with it (docs/performance.md). Benchmarks print it beside their figures.
#pragma once

namespace lattice {

// Round trip in nanoseconds of a cache line between `cpu_a` (the calling thread, bound for the
// measurement and then restored) and `cpu_b` (a helper thread): the mean of the fastest batch of
// 200 bounces among `round_trips`, so that a batch the scheduler interrupted does not count; the
// batches finished within `timeout_s` when the rest take longer. 0 when nothing could be
// measured: a CPU the process may not use, the same CPU twice, or no batch within `timeout_s`.
double cache_line_round_trip_ns(int cpu_a, int cpu_b, int round_trips = 20000,
                                double timeout_s = 1.0);

// The round trip between the first two CPUs the calling thread may use, as the benchmarks and
// `lattice doctor` report it; ns 0 when there is one CPU or nothing could be measured.
struct CpuDistance {
  int cpu_a = 0, cpu_b = 1;
  double ns = 0;
};
CpuDistance first_cpus_distance();

}  // namespace lattice
