// A few real training steps of one pp × dp × tp layout on in-process ranks, for comparing with
// the planner (`lattice plan --validate`, docs/planner.md "Validation") and for the doctor's
// probe (doctor/probe.h): every rank's arena accounting (core/arena.h: live and peak bytes per
// category) once the Trainer is built and after the steps, the wall time, loss and gradient
// norm of each step, and the hashes of what each rank holds at the end.
//
// It lives in train/ because it needs the Trainer; it knows nothing of plan/ (plan/ runs
// nothing, and train/ sits above plan/ in DESIGN.md's layers): cli/ puts the two side by side.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm_types.h"
#include "core/arena.h"
#include "model/transformer.h"
#include "parallel/device_mesh.h"
#include "spec/pipeline_schedule.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace lattice {

// What LayoutRunOptions::after_step sees of a rank.
struct LayoutRunRank {
  Trainer& trainer;
  Arena& arena;
  MeshCoordinates at;
  int step = 0;  // 0-based, warm-up included
  // Tensors the hook allocates and wants held until the rank is measured (a leaked buffer).
  std::vector<Tensor>& held;
};

struct LayoutRunOptions {
  // The layout, as lattice train reads it (dp, tp, sp, ZeRO, pp, schedule, chunks, recompute,
  // buckets); the step's micro-batches are the config's (TrainConfig::micro_batches).
  ParallelConfig layout;
  int threads = 1;  // per rank (the caller keeps ranks × threads within the cores, DESIGN.md 7)
  int warmup_steps = 1;  // untimed steps first (page faults, oneDNN primitive caches)
  int steps = 3;         // timed steps; 0: build the Trainer only
  // Tokens in memory (probes); empty: the config's data_dir.
  std::optional<TrainingData> data = {};
  // Called on every rank after each of its steps (warm-up included), before the last one's
  // state is measured: the doctor's tests create a fault condition here.
  std::function<void(LayoutRunRank&)> after_step = {};
  // Every collective's deadline, seconds; 0: the config's (TrainConfig::collective_timeout_s).
  double collective_timeout_s = 0;
};

// What one group of a rank carried during the steps, per collective (summed over algorithms).
struct GroupTraffic {
  std::string group;  // the mesh's name, e.g. "dp[pp0·tp0]"
  int size = 1;
  Collective collective = Collective::kAllReduce;
  uint64_t calls = 0;
  uint64_t bytes = 0;  // nccl-tests' count (comm/comm_stats.h)
  double seconds = 0;
};

// One rank's run: its arena, its flat parameter store, its steps and what it holds after them.
struct RankRun {
  MeshCoordinates at;
  MemoryStats constructed;  // the Trainer built, before any step
  MemoryStats finished;     // after the steps; peaks cover construction and every step
  // Elements with the 16-element alignment of every tensor (ParameterRegistry::total_elements)
  // and without it (the sum of the local shards).
  int64_t store_elements = 0;
  int64_t unpadded_elements = 0;
  int64_t optimizer_elements = 0;  // the AdamW range (its ZeRO shard, or the whole store)
  std::vector<double> losses;      // every step's, warm-up included
  std::vector<double> grad_norms;  // every step's global gradient norm before clipping
  // FNV-1a of each parameter's values (parallel/replica_check.h: the f32 master, or the
  // replicated compute copy where the master is ZeRO-sharded) in registry order with their
  // names; empty under ZeRO-3, where no rank holds a whole parameter.
  std::vector<uint64_t> parameter_hashes;
  std::vector<std::string> parameter_names;
  // FNV-1a of the AdamW moments when the optimizer holds them whole (ZeRO-0), else nullopt.
  std::optional<uint64_t> optimizer_hash;
  GradientSyncStats gradient_sync;    // of the last step (all zero without a dp group)
  PipelineStepStats pipeline;         // of the last step (all zero without a pp group)
  std::vector<GroupTraffic> traffic;  // its dp, tp and cp groups, every collective they ran
};

struct LayoutRunResult {
  // Rank 0 (pp 0, dp 0, tp 0): the fields of its RankMemory, for the common case.
  MemoryStats constructed;
  MemoryStats finished;
  int64_t store_elements = 0;
  int64_t unpadded_elements = 0;
  int64_t optimizer_elements = 0;
  std::vector<RankRun> ranks;   // (world) by world rank: rank = (pp·dp + dp)·tp + tp
  std::vector<double> step_ms;  // rank 0's wall time of each timed step
  // Rank 0's thread CPU time of each timed step: its compute without the time it waited blocked
  // or was descheduled (a diagnostic for shared machines; threads = 1, so the rank's thread does
  // all its compute; the dp reducer's comm thread is not counted).
  std::vector<double> step_cpu_ms;
  // Of each timed step of rank 0, the optimizer's part (StepMetrics::optimizer_ms), which grows
  // with the parameters rather than with the FLOPs.
  std::vector<double> step_optimizer_ms;
  std::vector<double> losses;  // every step's loss, warm-up included
  int threads = 0;             // per rank, as run

  double median_step_ms() const;            // requires steps > 0
  double median_step_cpu_ms() const;        // requires steps > 0
  double median_step_optimizer_ms() const;  // requires steps > 0
  // The fastest timed step and optimizer part: the same work each step, so the least disturbed
  // by whatever else shares the cores (a prediction's base; requires steps > 0).
  double fastest_step_ms() const;
  double fastest_step_optimizer_ms() const;
  // The rank at (stage, dp 0, tp 0).
  const RankRun& stage(int stage) const;
};

// `config`'s batch must resolve for options.dp (TrainConfig::resolve_batch); its data_dir must
// hold train.bin unless options.data gives the tokens. Runs pp · dp · tp ranks as threads of this
// process; rethrows the first rank's error.
LayoutRunResult run_layout(const TrainConfig& config, const LayoutRunOptions& options);

}  // namespace lattice
