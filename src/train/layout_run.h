// A few real training steps of one pp × dp × tp layout on in-process ranks, for comparing with
// the planner (`lattice plan --validate`, docs/planner.md "Validation"): every rank's arena
// accounting (core/arena.h: live and peak bytes per category) once the Trainer is built and after
// the steps, and the wall time of each step.
//
// It lives in train/ because it needs the Trainer; it knows nothing of plan/ (plan/ runs
// nothing, and train/ sits above plan/ in DESIGN.md's layers): cli/ puts the two side by side.
#pragma once

#include <cstdint>
#include <vector>

#include "core/arena.h"
#include "model/transformer.h"
#include "parallel/device_mesh.h"
#include "spec/pipeline_schedule.h"
#include "train/train_config.h"

namespace lattice {

struct LayoutRunOptions {
  int dp = 1;
  int tp = 1;
  bool sequence_parallel = false;
  int zero = 0;  // ZeRO stage over dp (ParallelSetup::zero)
  // Pipeline (docs/pipeline-parallel.md): stages, schedule, model chunks per stage; the step's
  // micro-batches are the config's (TrainConfig::micro_batches).
  int pp = 1;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  int virtual_stages = 1;
  Recompute recompute = Recompute::kNone;
  int threads = 1;  // per rank (the caller keeps ranks × threads within the cores, DESIGN.md 7)
  int warmup_steps = 1;            // untimed steps first (page faults, oneDNN primitive caches)
  int steps = 3;                   // timed steps; 0: build the Trainer only
  int64_t bucket_bytes = 1 << 20;  // data-parallel gradient bucket (f32 bytes)
};

// One rank's memory: its arena and its flat parameter store.
struct RankMemory {
  MeshCoordinates at;
  MemoryStats constructed;  // the Trainer built, before any step
  MemoryStats finished;     // after the steps; peaks cover construction and every step
  // Elements with the 16-element alignment of every tensor (ParameterRegistry::total_elements)
  // and without it (the sum of the local shards).
  int64_t store_elements = 0;
  int64_t unpadded_elements = 0;
  int64_t optimizer_elements = 0;  // the AdamW range (its ZeRO shard, or the whole store)
};

struct LayoutRunResult {
  // Rank 0 (pp 0, dp 0, tp 0): the fields of its RankMemory, for the common case.
  MemoryStats constructed;
  MemoryStats finished;
  int64_t store_elements = 0;
  int64_t unpadded_elements = 0;
  int64_t optimizer_elements = 0;
  std::vector<RankMemory> ranks;  // (world) by world rank: rank = (pp·dp + dp)·tp + tp
  std::vector<double> step_ms;    // rank 0's wall time of each timed step
  // Rank 0's thread CPU time of each timed step: its compute without the time it waited blocked
  // or was descheduled (a diagnostic for shared machines; threads = 1, so the rank's thread does
  // all its compute; the dp reducer's comm thread is not counted).
  std::vector<double> step_cpu_ms;
  std::vector<double> losses;  // every step's loss, warm-up included
  int threads = 0;             // per rank, as run

  double median_step_ms() const;      // requires steps > 0
  double median_step_cpu_ms() const;  // requires steps > 0
  // The rank at (stage, dp 0, tp 0).
  const RankMemory& stage(int stage) const;
};

// `config`'s batch must resolve for options.dp (TrainConfig::resolve_batch); its data_dir must
// hold train.bin. Runs pp · dp · tp ranks as threads of this process; rethrows the first rank's
// error.
LayoutRunResult run_layout(const TrainConfig& config, const LayoutRunOptions& options);

}  // namespace lattice
