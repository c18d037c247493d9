// Each rank has a thread budget; ranks x threads never exceed the cores (DESIGN.md invariant 7).
// oneDNN and Lattice's OpenMP loops run on the calling thread's OpenMP team, whose size is a
// per-thread setting, so a rank thread sets its own budget without touching other ranks.
#pragma once

namespace lattice {

// Sets the number of threads the calling thread's parallel regions (and oneDNN calls) use.
void set_thread_budget(int threads);
int thread_budget();
// Cores available to this process (sched affinity), at least 1.
int available_cores();

}  // namespace lattice
