// Small measurement helpers shared by the trainer, the benchmarks and the planner's validation:
// the median of a sample and the calling thread's CPU time.
#pragma once

#include <vector>

namespace lattice {

// The middle value (the mean of the two middle ones for an even count). Throws ContractError
// on an empty sample.
double median(std::vector<double> values);

// CPU seconds the calling thread has run: its own work, without the time it waited blocked or
// sat preempted by other processes (a rank with a thread budget of 1 runs its kernels on it).
double thread_cpu_seconds();

}  // namespace lattice
