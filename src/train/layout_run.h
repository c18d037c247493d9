// A few real training steps of one dp × tp layout on in-process ranks, for comparing with the
// planner (`lattice plan --validate`, docs/planner.md "Validation"): rank 0's arena accounting
// (core/arena.h: live and peak bytes per category) once the Trainer is built and after the steps,
// and the wall time of each step.
//
// It lives in train/ because it needs the Trainer; it knows nothing of plan/ (plan/ runs
// nothing, and train/ sits above plan/ in DESIGN.md's layers): cli/ puts the two side by side.
#pragma once

#include <cstdint>
#include <vector>

#include "core/arena.h"
#include "train/train_config.h"

namespace lattice {

struct LayoutRunOptions {
  int dp = 1;
  int tp = 1;
  bool sequence_parallel = false;
  int zero = 0;     // 0 or 1 (ZeRO-1 over dp)
  int threads = 1;  // per rank (the caller keeps ranks × threads within the cores, DESIGN.md 7)
  int warmup_steps = 1;            // untimed steps first (page faults, oneDNN primitive caches)
  int steps = 3;                   // timed steps; 0: build the Trainer only
  int64_t bucket_bytes = 1 << 20;  // data-parallel gradient bucket (f32 bytes)
};

struct LayoutRunResult {
  MemoryStats constructed;      // rank 0, the Trainer built, before any step
  MemoryStats finished;         // rank 0 after the steps; peaks cover construction and every step
  std::vector<double> step_ms;  // rank 0's wall time of each timed step
  std::vector<double> losses;   // every step's loss, warm-up included
  // Rank 0's flat parameter store: elements with the 16-element alignment of every tensor
  // (ParameterRegistry::total_elements) and without it (the sum of the local shards).
  int64_t store_elements = 0;
  int64_t unpadded_elements = 0;
  int64_t optimizer_elements = 0;  // rank 0's AdamW range (its ZeRO shard, or the whole store)
  int threads = 0;                 // per rank, as run

  double median_step_ms() const;  // requires steps > 0
};

// `config`'s batch must resolve for options.dp (TrainConfig::resolve_batch); its data_dir must
// hold train.bin. Runs dp · tp ranks as threads of this process; rethrows the first rank's error.
LayoutRunResult run_layout(const TrainConfig& config, const LayoutRunOptions& options);

}  // namespace lattice
