// How the Lattice runtime (TrainingSetup::runtime == Runtime::kLattice) lays a pipeline out on
// its stages: which layers each stage holds and how many activation slots it allocates.
//
// plan/ cannot call the runtime (it links core/ and spec/ only, DESIGN.md); the pure parts
// both need live in spec/:
//   - the partition is the runtime's own (spec/transformer_partition.h, which
//     train/pipeline_stage.cpp partition_model calls too): the p·v chunks whose slowest chunk is
//     fastest, then the most even (least Σ compute²), ties giving earlier chunks more layers;
//   - the slots are a closed form of spec/pipeline_schedule.h activation_slots over the
//     schedule's program, which tests/plan/lattice_stages_test.cpp holds equal over a sweep
//     (the search prices thousands of layouts and cannot build each one's program): the most
//     (micro-batch, chunk) pairs alive at once on the stage, from the forward until the
//     backward or, under zb-h1, until the weight pass (which the schedule delays: min(m, p) on
//     every stage, more than 1F1B's min(m, p − stage)). Micro-batch mb uses slot mb % slots and
//     a slot holds buffers for every chunk of the stage, so the runtime allocates min(peak, m)
//     slots of all the stage's chunks — with interleaving up to v× what the live chunks need
//     (docs/pipeline-parallel.md).
#pragma once

#include <cstdint>
#include <vector>

#include "plan/layout.h"
#include "plan/model_spec.h"

namespace lattice::plan {

struct LatticeChunk {
  int64_t first_layer = 0;  // layers [first_layer, last_layer)
  int64_t last_layer = 0;
  bool embedding = false;  // model chunk 0
  bool head = false;       // model chunk p·v − 1
  int64_t layers() const { return last_layer - first_layer; }
};

// The chunks one pipeline stage holds, in local order (local chunk c = model chunk c·p + stage).
struct LatticeStagePart {
  std::vector<LatticeChunk> chunks;
  int64_t layers() const;
  bool has_embedding() const;
  bool has_head() const;
};

// p·v layer counts in model order, as the runtime's balanced partition chooses them, or `given`
// when not empty (checked as the runtime checks its layers_per_chunk). ConfigError when the model
// has fewer layers than chunks or `given` does not describe them.
std::vector<int64_t> lattice_layers_per_chunk(const ModelSpec& model, int64_t p, int64_t v,
                                              const std::vector<int64_t>& given = {});

// Stage `stage`'s chunks (p = v = 1: the whole model, one chunk with the embedding and the head),
// of the partition `counts` (p·v layer counts in model order; empty: the balanced partition).
LatticeStagePart lattice_stage_part(const ModelSpec& model, int64_t p, int64_t v, int64_t stage,
                                    const std::vector<int64_t>& counts = {});

// Activation slots the runtime allocates on `stage` for m micro-batches: 1 without a pipeline
// (gradient accumulation reuses one), min(m, p) under zb-h1, else min(chunks_in_flight, m).
int64_t lattice_activation_slots(Schedule schedule, int64_t p, int64_t m, int64_t v, int64_t stage);

}  // namespace lattice::plan
