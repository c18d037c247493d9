// The pipeline partition of a transformer, one function for the runtime (train/pipeline_stage.h
// partition_model) and the planner (plan/lattice_stages.h), so that the planner prices the
// stages the runtime builds.
//
// Costs are forward FLOPs per token: a layer 2·(its weights) + 2·T·C (causal attention), the
// embedding none (but its table's memory), the head 2·C·V (and the table's memory when untied).
#pragma once

#include <cstdint>
#include <vector>

#include "spec/model_kinds.h"
#include "spec/stage_partition.h"

namespace lattice {

// What the partition's costs depend on.
struct TransformerDims {
  int64_t n_layer = 0;
  int64_t d_model = 0;     // C
  int64_t d_ff = 0;        // F
  int64_t kv_width = 0;    // width of K (and V)
  int64_t vocab_size = 0;  // V
  int64_t seq_len = 0;     // T: the model's context
  MlpKind mlp = MlpKind::kGelu;
  PositionKind position = PositionKind::kLearned;
  bool tied_embeddings = true;
};

// The p·v chunks (partition_stages: the slowest chunk fastest, then the most even, ties giving
// earlier chunks more layers), or `layers_per_chunk` when given (p·v counts). ConfigError as
// partition_stages.
StagePartition partition_transformer(const TransformerDims& dims, int stages, int virtual_stages,
                                     const std::vector<int>& layers_per_chunk = {});

}  // namespace lattice
