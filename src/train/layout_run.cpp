#include "train/layout_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "comm/thread_world.h"
#include "core/error.h"
#include "core/thread_budget.h"
#include "parallel/device_mesh.h"
#include "train/trainer.h"

namespace lattice {

double LayoutRunResult::median_step_ms() const {
  LATTICE_CHECK(!step_ms.empty(), "median of no timed steps");
  std::vector<double> sorted = step_ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t mid = sorted.size() / 2;
  return sorted.size() % 2 == 1 ? sorted[mid] : 0.5 * (sorted[mid - 1] + sorted[mid]);
}

LayoutRunResult run_layout(const TrainConfig& config, const LayoutRunOptions& options) {
  const int world = options.dp * options.tp;
  if (options.dp < 1 || options.tp < 1 || options.threads < 1 || options.steps < 0 ||
      options.warmup_steps < 0) {
    LATTICE_THROW(ConfigError,
                  "layout dp {} tp {} with {} thread(s), {} + {} steps ---> HINT: sizes and "
                  "threads must be at least 1, step counts at least 0",
                  options.dp, options.tp, options.threads, options.warmup_steps, options.steps);
  }
  LayoutRunResult result;
  std::mutex mutex;
  run_ranks(world, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {.pp = 1, .dp = options.dp, .tp = options.tp});
    Arena arena(fmt::format("rank{}", comm.rank()));
    Trainer trainer(config, arena,
                    {.dp = &mesh.dp(),
                     .zero = options.zero,
                     .bucket_bytes = options.bucket_bytes,
                     .threads = options.threads,
                     .tp = &mesh.tp(),
                     .sequence_parallel = options.sequence_parallel});
    const MemoryStats constructed = arena.stats();
    std::vector<double> step_ms, losses;
    for (int s = 0; s < options.warmup_steps + options.steps; ++s) {
      const StepMetrics m = trainer.train_step();
      losses.push_back(m.loss);
      if (s >= options.warmup_steps) step_ms.push_back(m.ms);
    }
    if (comm.rank() != 0) return;
    std::lock_guard lock(mutex);
    result.constructed = constructed;
    result.finished = arena.stats();
    result.step_ms = std::move(step_ms);
    result.losses = std::move(losses);
    const ParameterRegistry& registry = trainer.model().registry();
    result.store_elements = registry.total_elements();
    for (const ParameterSpec& spec : registry.specs())
      result.unpadded_elements += spec.local_shape.numel();
    result.optimizer_elements = trainer.optimizer().shard_end() - trainer.optimizer().shard_begin();
    result.threads = thread_budget();
  });
  return result;
}

}  // namespace lattice
