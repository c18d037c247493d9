// Everything a plan depends on besides the layout: the model, the cluster, how many devices,
// the batch, and the numerics the runtime uses.
#pragma once

#include <cstdint>
#include <string_view>

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

// Whose allocation pattern the memory model follows.
//  kMegatron: Megatron-LM / the ZeRO paper on GPUs: bf16 parameters and gradients (2 + 2 B), the
//    fp32 master weights with the Adam moments in the optimizer state (12 B, sharded from ZeRO-1),
//    two gradient buckets for data parallelism, a b·s·h staging buffer for tensor parallelism.
//  kLattice: this repository's runtime (src/model/parameters.h, src/train/optimizer.h): the f32
//    master weights are the parameter store itself (plus a bf16 compute copy under bf16 compute:
//    4 + 2 B), gradients are always f32 (4 B), the optimizer state is the two f32 moments (8 B,
//    the only part ZeRO-1 shards: every replica keeps the whole master); data-parallel buckets are
//    reduced in place in the gradient buffer and tensor-parallel collectives work on activation
//    buffers, so there are no communication buffers; under sequence parallelism the gradients of
//    the replicated parameters (norms, row-parallel biases, learned positions) are packed into one
//    more f32 buffer for their group all-reduce (Transformer::reduce_partial_grads).
enum class Runtime { kMegatron, kLattice };

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
  Runtime runtime = Runtime::kMegatron;
  // The share of a device's usable memory kept free (--headroom 10%): a layout fits only within
  // the rest, so the recommendation does not sit at 99% of the device (fragmentation, a longer
  // batch, another process).
  double memory_headroom = 0;

  // What a layout may use per device: the usable memory less the headroom.
  double memory_capacity() const { return cluster.usable_memory_bytes() * (1.0 - memory_headroom); }

  StateBytes bytes() const {
    StateBytes b;
    if (precision == Precision::kFp32)
      b = {.parameter = 4, .gradient = 4, .optimizer = 8, .activation = 4};
    if (fp32_gradients) b.gradient = 4;
    if (runtime == Runtime::kLattice && precision == Precision::kBf16)
      b = {.parameter = 4 + 2, .gradient = 4, .optimizer = 8, .activation = 2};
    return b;
  }
};

std::string_view runtime_name(Runtime runtime);

// Checks the setup on its own (not any layout); throws ConfigError naming the field and the fix.
void validate(const TrainingSetup& setup);

}  // namespace lattice::plan
