#include "core/thread_budget.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>

#include <cerrno>
#include <cstring>
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

std::vector<int> affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

namespace {

void set_affinity(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cpus) CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    LATTICE_THROW(ConfigError,
                  "cannot bind to CPUs {}: {} ---> HINT: pick CPUs this process may use",
                  fmt::join(cpus, ","), std::strerror(errno));
  }
}

}  // namespace

ScopedThreadAffinity::ScopedThreadAffinity(const std::vector<int>& cpus)
    : before_(affinity_cpus()) {
  set_affinity(cpus);
}

ScopedThreadAffinity::~ScopedThreadAffinity() {
  if (before_.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : before_) CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

}  // namespace lattice
