#include "spec/transformer_partition.h"

namespace lattice {

StagePartition partition_transformer(const TransformerDims& d, int stages, int virtual_stages,
                                     const std::vector<int>& layers_per_chunk) {
  const double C = double(d.d_model), F = double(d.d_ff), V = double(d.vocab_size);
  const double KV = double(d.kv_width), T = double(d.seq_len);
  const double mlp_matrices = d.mlp == MlpKind::kSwiglu ? 3.0 : 2.0;
  const double layer_weights = C * (C + 2 * KV) + C * C + mlp_matrices * C * F;
  const StageCost layer{2.0 * layer_weights + 2.0 * T * C, layer_weights};
  StagePartitionInput input;
  input.layers.assign(size_t(d.n_layer), layer);
  input.embedding = {0.0, V * C + (d.position == PositionKind::kLearned ? T * C : 0)};
  input.head = {2.0 * C * V, d.tied_embeddings ? 0.0 : V * C};
  input.stages = stages;
  input.virtual_stages = virtual_stages;
  return layers_per_chunk.empty() ? partition_stages(input)
                                  : partition_stages(input, layers_per_chunk);
}

}  // namespace lattice
