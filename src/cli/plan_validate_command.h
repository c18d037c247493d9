// `lattice plan --validate`: the planner's predicted memory and step time of a few layouts
// next to real runs of them on this machine (docs/planner.md, "Validation").
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "plan/model_spec.h"

namespace lattice::cli {

struct PlanValidateArgs {
  std::string model = "gpt2-tiny";  // a trainer preset or a training config (.toml)
  std::string cluster;              // a preset or profile; empty: the default (see below)
  int64_t global_batch = 8;         // sequences per step, split over dp
  int64_t seq = 0;                  // 0: the model's
  std::string precision = "fp32";   // the trainer's compute dtype: fp32 or bf16
  std::vector<std::string> layouts{"dp1tp1", "dp2", "tp2", "tp2+sp", "dp2+zero1"};
  int steps = 5;     // timed steps per layout
  int warmup = 2;    // untimed steps first
  int threads = 1;   // per rank: a calibrated profile's device is one rank of --threads cores
  std::string data;  // a directory with train.bin; empty: synthetic tokens in a temporary one
  double time_factor = 2.0;
  bool json = false;
};

// The planner's description of a trainer model config (plan/ cannot see model/): the trainer
// stores the vocabulary unpadded on one rank and padded to a multiple of tp on tp ranks.
plan::ModelSpec plan_model_spec(const ModelConfig& config, int64_t tp);

// Runs the layouts, prints the table (or JSON); throws when a layout cannot run. Returns the
// number of flagged rows.
int run_plan_validate(const PlanValidateArgs& args);

}  // namespace lattice::cli
