#include "core/thread_budget.h"

#include <sched.h>

#include <thread>

#include "core/error.h"

#if defined(LATTICE_USE_OPENMP)
#include <omp.h>
#endif

namespace lattice {

namespace {
thread_local int budget = 0;  // 0: not set on this thread
}

void set_thread_budget(int threads) {
  LATTICE_CHECK_GE(threads, 1, "a rank needs at least one thread");
  budget = threads;
#if defined(LATTICE_USE_OPENMP)
  omp_set_num_threads(threads);
#endif
}

int thread_budget() {
  return budget;
}

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace lattice
