// One rank's whole training run, what `lattice train` does on every rank of its mesh: the
// Trainer built on the config's layout, its start (--init-from weights, the newest in-memory
// snapshot under an agent, or --resume), then the outer loop around Trainer::train_step —
// periodic and asynchronous checkpoints, in-memory snapshots, validation every
// eval.interval steps, the progress line every train.log_interval steps, metrics, a stop agreed
// by every rank (SIGTERM: a durable checkpoint, then return) — and its end: the final
// checkpoint, the trace, the memory peaks, the summary and the sampled text.
//
// World rank 0 alone prints and writes metrics; every rank evaluates, saves its part of each
// checkpoint and samples in step (docs/checkpoints.md, docs/elastic.md). The CLI parses and
// checks the command, starts the ranks (comm/launch.h, elastic/elastic_rank.h) and calls this.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "elastic/rank_session.h"
#include "parallel/device_mesh.h"
#include "trace/event_recorder.h"
#include "train/train_config.h"

namespace lattice {

struct RunOptions {
  std::string metrics;    // one JSON object per step into this file; empty: none
  std::string init_from;  // Hugging Face weights to start from; empty: the seed's init
  std::string trace;      // directory of one Chrome/Perfetto trace per rank; empty: no trace
  // A checkpoint directory, or "auto": the newest valid one under output.dir/checkpoints (none:
  // a fresh start); empty: no resume.
  std::string resume;
  std::vector<std::string> resume_allow_changes;  // keys a resume may change (ResumeOptions)
  TraceClock::time_point trace_origin = TraceClock::now();  // shared by a process's ranks
  // `--plan CLUSTER`: the planner's forecast of this run (forecast/forecast.h), kept in
  // metrics/run.json for lattice report; null: none.
  nlohmann::json plan = nullptr;
};

// `session`: the rank's link to its `lattice launch` agent (snapshots, fencing), or nullptr.
// Collective over mesh.world(): every rank calls it with the same config and options.
void run_training(const TrainConfig& config, const RunOptions& options, DeviceMesh& mesh,
                  RankSession* session);

}  // namespace lattice
