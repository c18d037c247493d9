// Everything a plan depends on besides the layout: the model, the cluster, how many devices,
// the batch, and the numerics the runtime uses.
#pragma once

#include <cstdint>

#include "plan/cluster_spec.h"
#include "plan/model_spec.h"

namespace lattice::plan {

// Bytes per element of each kind of state.
struct StateBytes {
  double parameter = 2;   // the working copy the forward reads
  double gradient = 2;    // accumulated gradients
  double optimizer = 12;  // fp32 master + Adam m + v (ZeRO paper's K = 12)
  double activation = 2;
};

struct TrainingSetup {
  ModelSpec model;
  ClusterSpec cluster;
  int64_t devices = 0;       // nodes × gpus_per_node
  int64_t global_batch = 0;  // sequences per optimizer step
  int64_t seq_len = 0;       // s
  Precision precision = Precision::kBf16;
  bool fp32_gradients = false;  // accumulate gradients in fp32 (Megatron's 18 B/param variant)
  // The runtime's attention kernel is flash-style (kernels/attention.h): the s×s scores are
  // never stored. Dropout is off in Lattice's blocks. Both can be switched on to reproduce
  // Korthikanti et al.'s setting.
  bool flash_attention = true;
  bool dropout = false;

  StateBytes bytes() const {
    StateBytes b;
    if (precision == Precision::kFp32)
      b = {.parameter = 4, .gradient = 4, .optimizer = 8, .activation = 4};
    if (fp32_gradients) b.gradient = 4;
    return b;
  }
};

// Checks the setup on its own (not any layout); throws ConfigError naming the field and the fix.
void validate(const TrainingSetup& setup);

}  // namespace lattice::plan
