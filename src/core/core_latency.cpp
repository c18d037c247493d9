#include "core/core_latency.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/thread_budget.h"

namespace lattice {
namespace {

using Clock = std::chrono::steady_clock;

// The bounced line: the caller writes odd values, the helper answers with the next even one.
// aborted is on a line of its own, so that checking it does not disturb the bounce.
struct Bounce {
  alignas(64) std::atomic<int> value{0};
  alignas(64) std::atomic<bool> aborted{false};
};

// Spins until the line holds `expected`; false once either side aborted or `deadline` passed.
bool await(Bounce& bounce, int expected, Clock::time_point deadline) {
  for (int spins = 0; bounce.value.load(std::memory_order_acquire) != expected; ++spins) {
    if ((spins & 1023) == 1023 &&
        (bounce.aborted.load(std::memory_order_relaxed) || Clock::now() > deadline)) {
      bounce.aborted.store(true, std::memory_order_relaxed);
      return false;
    }
  }
  return true;
}

}  // namespace

double cache_line_round_trip_ns(int cpu_a, int cpu_b, int round_trips, double timeout_s) {
  LATTICE_CHECK_GT(round_trips, 0);
  if (cpu_a == cpu_b) return 0;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  Bounce bounce;
  std::atomic<bool> helper_bound{false};
  std::jthread helper([&] {
    std::optional<ScopedThreadAffinity> bound;
    try {
      bound.emplace(std::vector<int>{cpu_b});
    } catch (const ConfigError&) {
      bounce.aborted.store(true);
      return;
    }
    helper_bound.store(true, std::memory_order_release);
    for (int i = 0; i < round_trips; ++i) {
      if (!await(bounce, 2 * i + 1, deadline)) return;
      bounce.value.store(2 * i + 2, std::memory_order_release);
    }
  });
  std::optional<ScopedThreadAffinity> bound;
  try {
    bound.emplace(std::vector<int>{cpu_a});
  } catch (const ConfigError&) {
    bounce.aborted.store(true);
    return 0;
  }
  while (!helper_bound.load(std::memory_order_acquire)) {
    if (bounce.aborted.load() || Clock::now() > deadline) {
      bounce.aborted.store(true);
      return 0;
    }
    std::this_thread::yield();
  }
  // Timed in batches, the fastest counting: a batch in which the scheduler ran something else on
  // either CPU measures that, not the distance. Past the deadline the batches done still count.
  constexpr int kBatch = 200;
  double best_ns = 0;
  for (int done = 0; done < round_trips;) {
    const int batch = std::min(kBatch, round_trips - done);
    const Clock::time_point start = Clock::now();
    for (int i = done; i < done + batch; ++i) {
      bounce.value.store(2 * i + 1, std::memory_order_release);
      if (!await(bounce, 2 * i + 2, deadline)) return best_ns;
    }
    const double ns =
        std::chrono::duration<double, std::nano>(Clock::now() - start).count() / double(batch);
    if (best_ns == 0 || ns < best_ns) best_ns = ns;
    done += batch;
  }
  return best_ns;
}

CpuDistance first_cpus_distance() {
  const std::vector<int> cpus = affinity_cpus();
  if (cpus.size() < 2) return {};
  return {cpus[0], cpus[1], cache_line_round_trip_ns(cpus[0], cpus[1])};
}

}  // namespace lattice
