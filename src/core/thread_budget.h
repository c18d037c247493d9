// Each rank has a thread budget; ranks x threads never exceed the cores (DESIGN.md invariant 7).
// oneDNN and Lattice's OpenMP loops run on the calling thread's OpenMP team, whose size is a
// per-thread setting, so a rank thread sets its own budget without touching other ranks.
#pragma once

#include <vector>

namespace lattice {

// Sets the number of threads the calling thread's parallel regions (and oneDNN calls) use.
void set_thread_budget(int threads);
int thread_budget();
// Cores available to this process (sched affinity), at least 1.
int available_cores();
// The CPUs the calling thread may run on (sched_getaffinity), ascending; empty if unknown.
std::vector<int> affinity_cpus();

// Confines the calling thread to `cpus` while it lives, then restores its mask: a process it
// starts meanwhile (posix_spawn) inherits the mask (lattice launch --cores-per-rank). Throws
// ConfigError naming the CPUs when the kernel refuses them.
class ScopedThreadAffinity {
 public:
  explicit ScopedThreadAffinity(const std::vector<int>& cpus);
  ~ScopedThreadAffinity();
  ScopedThreadAffinity(const ScopedThreadAffinity&) = delete;
  ScopedThreadAffinity& operator=(const ScopedThreadAffinity&) = delete;

 private:
  std::vector<int> before_;
};

}  // namespace lattice
