// The doctor's probe: a few real steps of the configured layout on a slice of the model (a
// couple of layers, a short sequence, one sequence per micro-batch, tokens in memory) on
// in-process ranks, next to the same slice on one rank, and, when the config recomputes, the
// same layout without recompute. The checks compare what the runs measured (train/layout_run.h).
#pragma once

#include <functional>
#include <optional>

#include "train/layout_run.h"
#include "train/train_config.h"

namespace lattice::doctor {

struct ProbeOptions {
  int steps = 3;
  // false: the configured layout's run only (the step time for the timeouts check, as `lattice
  // launch` asks before it starts); no comparison runs, so `single` stays empty.
  bool compare = true;
  // Tests only: called after each step of the configured layout's run / of the run with the
  // recompute turned off, to create the condition a check must name.
  std::function<void(LayoutRunRank&)> after_layout_step = {};
  std::function<void(LayoutRunRank&)> after_toggled_step = {};
};

struct ProbeResult {
  TrainConfig config;  // the slice, with the batch resolved for the layout's dp
  LayoutRunResult layout;
  // The same layout with parallel.recompute = none; only when the config recomputes.
  std::optional<LayoutRunResult> without_recompute;
  LayoutRunResult single;  // the slice on one rank: the same global batch, the config's recompute
  double seconds = 0;      // wall time of the probe
};

// The slice of `config` the probe runs: layers enough for the pipeline's chunks (at least 2),
// a sequence of at most 32 tokens, one sequence per micro-batch (2·pp micro-batches per step
// under pp, else 1), the configured layout, precision, optimizer and recompute, no output. The
// layout's run uses gradient buckets of at most a quarter of the slice's store.
TrainConfig probe_config(const TrainConfig& config, int steps);

// Runs the probe on `config`'s [parallel] layout as threads of this process, one thread each.
// Rethrows the first rank's error (a collective that timed out names the rank that did not
// arrive).
ProbeResult run_probe(const TrainConfig& config, const ProbeOptions& options = {});

}  // namespace lattice::doctor
