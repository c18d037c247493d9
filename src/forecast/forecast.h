// The planner's prediction for a trainer config: the one place where the runtime's types
// (model/config.h, train/train_config.h) become the planner's (plan/model_spec.h, plan/layout.h)
// and back. `lattice train --plan CLUSTER` records the forecast in metrics/run.json and
// `lattice report` draws it next to what the run measured; `lattice plan --validate` and the
// planner's tests run planner layouts through the runtime with runtime_layout.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "model/config.h"
#include "plan/cluster_spec.h"
#include "plan/layout.h"
#include "plan/model_spec.h"
#include "plan/training_setup.h"
#include "train/train_config.h"

namespace lattice {

// The planner's description of a trainer model config: the trainer stores the vocabulary
// unpadded on one rank and padded to a multiple of tp on tp ranks.
plan::ModelSpec plan_model_spec(const ModelConfig& config, int64_t tp);

// The planner's layout of a config's [parallel] section and batch (resolved: micro_batch set).
plan::Layout plan_layout(const TrainConfig& config);

// The runtime's layout of a planner layout (as lattice plan --validate runs it).
ParallelConfig runtime_layout(const plan::Layout& layout);

// What the planner prices for this config on `cluster` (runtime model 'lattice': the buffers as
// the runtime allocates them).
plan::TrainingSetup plan_setup(const TrainConfig& config, const plan::Layout& layout,
                               plan::ClusterSpec cluster);

// The forecast of one run, as metrics/run.json's "plan" holds it:
//   {"cluster": NAME, "source": what was asked for, "layout": plan::describe(...),
//    "step_ms": ..., "parts_ms": {"compute", "optimizer", "exposed_comm", "pipeline_idle"},
//    "stages": [{"stage": s, "parameters", "gradients", "optimizer_states", "activations",
//                "other", "total"} (bytes of one rank of stage s)]}
// or {"cluster", "source", "layout", "rejected": why} when the planner rejects the layout
// (check_layout: e.g. a layers_per_chunk that does not sum to the layers). The parts follow
// the per-rank metrics' split (docs/observability.md): compute is forward + backward +
// recompute + tensor-parallel communication + the step's synchronising collectives, pipeline
// idle the bubble and the stage-to-stage sends.
nlohmann::json forecast_run(const TrainConfig& config, const plan::ClusterSpec& cluster,
                            const std::string& source);

}  // namespace lattice
