// Which transformer layers each pipeline chunk holds (issue 7 item 1): a cost model that counts
// the embedding (first chunk) and the output layer + loss (last chunk), which are light in
// compute and heavy in memory, plus a manual override.
//
// The model is cut into p·v chunks of consecutive layers; model chunk k runs on stage k % p as
// its local chunk k / p (Megatron's interleaving, as in pipeline_schedule.h). Every chunk holds
// at least one transformer layer: an empty chunk would still cost a pipeline hop and a slot in
// every micro-batch's path, so it is refused rather than planned.
#pragma once

#include <limits>
#include <vector>

namespace lattice {

// What a piece of the model adds to the chunk that holds it, in any consistent units:
// compute per micro-batch (e.g. FLOPs or seconds) and memory (e.g. bytes).
struct StageCost {
  double compute = 0.0;
  double memory = 0.0;
};

struct StagePartitionInput {
  std::vector<StageCost> layers;  // (L) transformer layers in model order
  StageCost embedding;            // added to the first chunk
  StageCost head;                 // output layer + loss, added to the last chunk
  int stages = 1;                 // p
  int virtual_stages = 1;         // v
  // No chunk may need more memory than this (the device's budget for one chunk).
  double max_chunk_memory = std::numeric_limits<double>::infinity();
};

struct ChunkLayers {
  int model_chunk = 0;  // 0 … p·v − 1 in model order
  int stage = 0;        // model_chunk % p
  int local_chunk = 0;  // model_chunk / p
  int first_layer = 0;  // layers [first_layer, last_layer)
  int last_layer = 0;
  bool has_embedding = false;
  bool has_head = false;
  StageCost cost;  // its layers plus the embedding / head it holds
  int layer_count() const { return last_layer - first_layer; }
};

struct StagePartition {
  std::vector<ChunkLayers> chunks;  // (p·v) in model order
  double max_compute = 0.0;         // the slowest chunk: what the pipeline runs at
  double max_memory = 0.0;
};

// The partition whose slowest chunk is as fast as possible with every chunk within
// max_chunk_memory. Among those, the one with the smallest Σ compute² (the most even), and among
// those the one giving earlier chunks more layers. Deterministic. ConfigError when L < p·v, a
// cost is negative or not finite, or no partition fits the memory cap (naming the smallest cap
// that would).
StagePartition partition_stages(const StagePartitionInput& input);

// Manual override: `layers_per_chunk` (p·v counts in model order). ConfigError unless there are
// p·v counts, each ≥ 1, summing to L, and every chunk fits max_chunk_memory.
StagePartition partition_stages(const StagePartitionInput& input,
                                const std::vector<int>& layers_per_chunk);

}  // namespace lattice
