#include "train/pipeline_stage.h"

#include "core/error.h"
#include "core/rank_progress.h"

namespace lattice {

StagePartition partition_model(const ModelConfig& c, int stages, int virtual_stages,
                               const std::vector<int>& layers_per_chunk) {
  return partition_transformer({.n_layer = c.n_layer,
                                .d_model = c.d_model,
                                .d_ff = c.d_ff,
                                .kv_width = c.kv_width(),
                                .vocab_size = c.vocab_size,
                                .seq_len = c.seq_len,
                                .mlp = c.mlp,
                                .position = c.position,
                                .tied_embeddings = c.tied_embeddings},
                               stages, virtual_stages, layers_per_chunk);
}

ModelPart stage_part(const StagePartition& partition, int stages, int stage) {
  ModelPart part;
  for (const ChunkLayers& chunk : partition.chunks) {
    if (chunk.stage != stage) continue;
    LATTICE_CHECK(chunk.model_chunk % stages == stage, "chunk {} is not on stage {}",
                  chunk.model_chunk, stage);
    part.chunks.push_back(
        LayerChunk{chunk.first_layer, chunk.last_layer, chunk.has_embedding, chunk.has_head});
  }
  return part;
}

ModelPipelineStage::ModelPipelineStage(Transformer& model, const std::vector<TokenBatch>& batches,
                                       int slots, float loss_scale)
    : model_(model),
      batches_(batches),
      slots_(slots),
      loss_scale_(loss_scale),
      occupant_(size_t(model.chunk_count()), std::vector<int>(size_t(slots), -1)) {}

int ModelPipelineStage::slot(int micro_batch, int chunk, bool take) {
  const int s = micro_batch % slots_;
  int& occupant = occupant_[size_t(chunk)][size_t(s)];
  if (take) {
    LATTICE_CHECK(occupant == -1 || occupant == micro_batch,
                  "activation slot {} of chunk {} still holds micro-batch {} when micro-batch {} "
                  "starts: more micro-batches in flight than the schedule's peak",
                  s, chunk, occupant, micro_batch);
    occupant = micro_batch;
  }
  return s;
}

void ModelPipelineStage::forward(int mb, int chunk) {
  report_phase(Phase::kForward);
  const TokenBatch& batch = batches_[size_t(mb)];
  ForwardResult r = model_.forward_chunk(chunk, slot(mb, chunk, true), batch.inputs, batch.targets);
  loss_sum_ += r.loss_sum;
  router_loss_sum_ += r.router_loss_sum;
  token_count_ += r.token_count;
}

void ModelPipelineStage::backward(int mb, int chunk) {
  report_phase(Phase::kBackward);
  model_.backward_chunk(chunk, slot(mb, chunk, false), loss_scale_);
  occupant_[size_t(chunk)][size_t(mb % slots_)] = -1;
}

void ModelPipelineStage::backward_input(int mb, int chunk) {
  report_phase(Phase::kBackward);
  model_.backward_chunk(chunk, slot(mb, chunk, false), loss_scale_, /*defer_weights=*/true);
}

void ModelPipelineStage::backward_weight(int mb, int chunk) {
  report_phase(Phase::kBackward);
  model_.backward_weight_chunk(chunk, slot(mb, chunk, false));
  occupant_[size_t(chunk)][size_t(mb % slots_)] = -1;
}

const Tensor& ModelPipelineStage::output(int mb, int chunk) {
  return model_.chunk_output(chunk, slot(mb, chunk, false));
}

Tensor& ModelPipelineStage::input(int mb, int chunk) {
  const TokenBatch& batch = batches_[size_t(mb)];
  return model_.chunk_input(chunk, slot(mb, chunk, true), batch.inputs.dim(0), batch.inputs.dim(1));
}

const Tensor& ModelPipelineStage::input_grad(int mb, int chunk) {
  return model_.chunk_input_grad(chunk, slot(mb, chunk, false));
}

Tensor& ModelPipelineStage::output_grad(int mb, int chunk) {
  const TokenBatch& batch = batches_[size_t(mb)];
  return model_.chunk_output_grad(chunk, slot(mb, chunk, false), batch.inputs.dim(0),
                                  batch.inputs.dim(1));
}

}  // namespace lattice
