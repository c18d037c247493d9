// Small measurement helpers shared by the trainer, the benchmarks and the planner's validation:
// the median and mean of a sample and the calling thread's CPU time.
#pragma once

#include <vector>

namespace lattice {

// The middle value (the mean of the two middle ones for an even count). Throws ContractError
// on an empty sample.
double median(std::vector<double> values);
// The arithmetic mean. Throws ContractError on an empty sample.
double mean(const std::vector<double>& values);

// One rank's run of steps slower than `factor` × the other ranks' median: a straggler once the
// run reaches `steps` in a row (the elastic agent's report, lattice train's live line and
// lattice doctor --run share the rule).
class StragglerStreak {
 public:
  static constexpr int kSteps = 3;
  // Counts this step; true exactly once: when the run first reaches `steps` steps.
  bool observe(double mine, double others_median, double factor, int steps = kSteps);
  int length() const { return length_; }

 private:
  int length_ = 0;
  bool reported_ = false;
};

// CPU seconds the calling thread has run: its own work, without the time it waited blocked or
// sat preempted by other processes (a rank with a thread budget of 1 runs its kernels on it).
double thread_cpu_seconds();

}  // namespace lattice
