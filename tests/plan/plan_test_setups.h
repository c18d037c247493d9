// Training setups shared by the planner's tests.
#pragma once

#include "plan/model_presets.h"
#include "plan/training_setup.h"

namespace lattice::plan::testing {

inline TrainingSetup setup_for(const char* model, const char* cluster, int64_t devices,
                               int64_t global_batch, int64_t seq_len) {
  TrainingSetup s;
  s.model = model_preset(model);
  s.cluster = cluster_preset(cluster);
  s.devices = devices;
  s.global_batch = global_batch;
  s.seq_len = seq_len;
  return s;
}

// The example: Llama-3-70B on 128 DGX H100 nodes (1024 GPUs).
inline TrainingSetup llama70b_on_1024_h100() {
  return setup_for("llama-3-70b", "dgx-h100", 1024, 1024, 4096);
}

}  // namespace lattice::plan::testing
