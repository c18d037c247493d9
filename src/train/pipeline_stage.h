// Pipeline parallelism in the trainer: which layers a stage holds (stage_partition.h with the
// transformer's costs) and the PipelineStage the runtime drives, on the stage's Transformer.
#pragma once

#include <vector>

#include "data/token_loader.h"
#include "model/transformer.h"
#include "parallel/pipeline_runtime.h"
#include "spec/stage_partition.h"
#include "spec/transformer_partition.h"

namespace lattice {

// The model cut into p·v chunks (spec/transformer_partition.h, which the planner calls too):
// balanced by the cost model, or by layers_per_chunk when given (p·v counts).
StagePartition partition_model(const ModelConfig& config, int stages, int virtual_stages,
                               const std::vector<int>& layers_per_chunk = {});

// The chunks stage `stage` holds, in local order (local chunk c = model chunk c·p + stage).
ModelPart stage_part(const StagePartition& partition, int stages, int stage);

// Runs chunks of the stage's Transformer for the runtime. Micro-batch mb uses activation slot
// mb % slots; activation_slots() of the stage's program bounds how many are live (checked).
class ModelPipelineStage : public PipelineStage {
 public:
  ModelPipelineStage(Transformer& model, const std::vector<TokenBatch>& batches, int slots,
                     float loss_scale);

  void forward(int micro_batch, int chunk) override;
  void backward(int micro_batch, int chunk) override;
  void backward_input(int micro_batch, int chunk) override;
  void backward_weight(int micro_batch, int chunk) override;
  const Tensor& output(int micro_batch, int chunk) override;
  Tensor& input(int micro_batch, int chunk) override;
  const Tensor& input_grad(int micro_batch, int chunk) override;
  Tensor& output_grad(int micro_batch, int chunk) override;

  double loss_sum() const { return loss_sum_; }
  double router_loss_sum() const { return router_loss_sum_; }  // this stage's sparse layers
  int64_t token_count() const { return token_count_; }         // the loss's tokens (last stage)

 private:
  int slot(int micro_batch, int chunk, bool take);

  Transformer& model_;
  const std::vector<TokenBatch>& batches_;
  int slots_;
  float loss_scale_;
  double loss_sum_ = 0.0;
  double router_loss_sum_ = 0.0;
  int64_t token_count_ = 0;
  std::vector<std::vector<int>> occupant_;  // [chunk][slot]: micro-batch in flight, or -1
};

}  // namespace lattice
