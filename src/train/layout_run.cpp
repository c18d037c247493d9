#include "train/layout_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "comm/launch.h"
#include "core/error.h"
#include "core/statistics.h"
#include "core/thread_budget.h"
#include "parallel/device_mesh.h"
#include "parallel/replica_check.h"
#include "train/trainer.h"

namespace lattice {

double LayoutRunResult::median_step_ms() const {
  return median(step_ms);
}

double LayoutRunResult::median_step_cpu_ms() const {
  return median(step_cpu_ms);
}

double LayoutRunResult::median_step_optimizer_ms() const {
  return median(step_optimizer_ms);
}

double LayoutRunResult::fastest_step_ms() const {
  return *std::min_element(step_ms.begin(), step_ms.end());
}

double LayoutRunResult::fastest_step_optimizer_ms() const {
  return *std::min_element(step_optimizer_ms.begin(), step_optimizer_ms.end());
}

const RankRun& LayoutRunResult::stage(int stage) const {
  for (const RankRun& rank : ranks)
    if (rank.at == MeshCoordinates{.pp = stage, .dp = 0, .tp = 0}) return rank;
  LATTICE_THROW(ValueError, "layout run has no pipeline stage {} ---> HINT: use 0 .. pp − 1",
                stage);
}

namespace {

void hash_held_state(Trainer& trainer, RankRun& run) {
  ParameterStore& store = trainer.model().parameters();
  if (!store.values_lent()) {
    const Tensor& values = store.master_sharded() ? store.compute() : store.master();
    const auto* base = static_cast<const unsigned char*>(values.raw_data());
    const int64_t element = int64_t(dtype_size(values.dtype()));
    const auto& specs = store.registry().specs();
    const std::vector<FlatRange> ranges = store.registry().padded_ranges();
    for (size_t i = 0; i < specs.size(); ++i) {
      run.parameter_names.push_back(specs[i].name);
      run.parameter_hashes.push_back(
          hash_bytes(base + ranges[i].begin * element, ranges[i].size() * element));
    }
  }
  AdamW& optimizer = trainer.optimizer();
  if (!optimizer.sharded()) {
    const uint64_t m = hash_floats(optimizer.m().data<float>(), optimizer.m().numel());
    const uint64_t v = hash_floats(optimizer.v().data<float>(), optimizer.v().numel());
    run.optimizer_hash = m ^ (v * 1099511628211ull);
  }
}

}  // namespace

LayoutRunResult run_layout(const TrainConfig& config, const LayoutRunOptions& options) {
  const ParallelConfig& layout = options.layout;
  const MeshShape shape{
      .pp = layout.pp, .dp = layout.dp, .tp = layout.tp, .cp = layout.cp, .ep = layout.ep};
  if (layout.dp < 1 || layout.tp < 1 || layout.pp < 1 || layout.cp < 1 || options.threads < 1 ||
      options.steps < 0 || options.warmup_steps < 0) {
    LATTICE_THROW(ConfigError,
                  "layout {} with {} thread(s), {} + {} steps ---> HINT: sizes and threads must "
                  "be at least 1, step counts at least 0",
                  shape.to_string(), options.threads, options.warmup_steps, options.steps);
  }
  LayoutRunResult result;
  result.ranks.resize(size_t(shape.world_size()));
  std::mutex mutex;
  // The run's own collective deadline: a rank that never arrives ends the steps in that time.
  CommConfig comm_config;
  const double timeout_s = options.collective_timeout_s > 0 ? options.collective_timeout_s
                                                            : config.collective_timeout_s();
  comm_config.timeout = std::chrono::milliseconds(int64_t(timeout_s * 1e3));
  // launch_ranks rather than run_ranks: LATTICE_SLOW_LINK (launch.h) slows a link here too.
  launch_ranks(
      TransportKind::kThreads, shape.world_size(),
      [&](Communicator& comm) {
        DeviceMesh mesh(comm, shape);
        Arena arena(fmt::format("rank{}", comm.rank()));
        ParallelSetup setup = parallel_setup(layout, mesh);
        setup.threads = options.threads;
        std::optional<Trainer> built;
        if (options.data) {
          built.emplace(config, arena, setup, *options.data);
        } else {
          built.emplace(config, arena, setup);
        }
        Trainer& trainer = *built;
        RankRun memory;
        memory.at = mesh.coordinates();
        memory.constructed = arena.stats();
        std::vector<double> step_ms, step_cpu_ms, step_optimizer_ms, losses;
        std::vector<Tensor> held;
        for (int s = 0; s < options.warmup_steps + options.steps; ++s) {
          const double cpu_before = 1e3 * thread_cpu_seconds();
          const StepMetrics m = trainer.train_step();
          const double cpu = 1e3 * thread_cpu_seconds() - cpu_before;
          losses.push_back(m.loss);
          memory.grad_norms.push_back(m.grad_norm);
          if (s >= options.warmup_steps) {
            step_ms.push_back(m.ms);
            step_cpu_ms.push_back(cpu);
            step_optimizer_ms.push_back(m.optimizer_ms);
          }
          if (options.after_step) {
            LayoutRunRank rank{trainer, arena, memory.at, s, held};
            options.after_step(rank);
          }
        }
        memory.finished = arena.stats();
        hash_held_state(trainer, memory);
        memory.gradient_sync = trainer.gradient_sync_stats();
        memory.pipeline = trainer.pipeline_stats();
        for (Communicator* group : {&mesh.replicas(), &mesh.tp(), mesh.cp(), mesh.ep()}) {
          if (group == nullptr || group->size() == 1) continue;
          for (int c = 0; c < kCollectiveCount; ++c) {
            const CollectiveTotals totals = group->stats().totals(Collective(c));
            if (totals.calls == 0) continue;
            memory.traffic.push_back({.group = group->name(),
                                      .size = group->size(),
                                      .collective = Collective(c),
                                      .calls = totals.calls,
                                      .bytes = totals.bytes,
                                      .seconds = totals.seconds});
          }
        }
        held.clear();
        memory.losses = losses;
        const ParameterRegistry& registry = trainer.model().registry();
        memory.store_elements = registry.total_elements();
        for (const ParameterSpec& spec : registry.specs())
          memory.unpadded_elements += spec.local_shape.numel();
        memory.optimizer_elements =
            trainer.optimizer().shard_end() - trainer.optimizer().shard_begin();
        std::lock_guard lock(mutex);
        if (comm.rank() == 0) {
          result.constructed = memory.constructed;
          result.finished = memory.finished;
          result.store_elements = memory.store_elements;
          result.unpadded_elements = memory.unpadded_elements;
          result.optimizer_elements = memory.optimizer_elements;
          result.step_ms = std::move(step_ms);
          result.step_cpu_ms = std::move(step_cpu_ms);
          result.step_optimizer_ms = std::move(step_optimizer_ms);
          result.losses = std::move(losses);
          result.threads = thread_budget();
        }
        result.ranks[size_t(comm.rank())] = std::move(memory);
      },
      comm_config);
  return result;
}

}  // namespace lattice
