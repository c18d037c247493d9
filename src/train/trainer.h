// One rank's training: the model, its optimizer and the data, and the step that ties them.
//
// A step reads top to bottom (train_step): the global batch of this step, forward and backward
// over its micro-batches, the global gradient norm and clipping, the learning rate of the
// schedule, the AdamW update. The loss of a step is the sum of token losses over the global
// batch divided by its token count (DESIGN.md invariant 1), never a mean of micro-batch means.
#pragma once

#include <memory>
#include <optional>

#include "core/arena.h"
#include "data/token_loader.h"
#include "model/transformer.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/train_config.h"

namespace lattice {

struct StepMetrics {
  int64_t step = 0;  // 1-based: the number of updates done after this step
  double loss = 0.0;
  float lr = 0.0f;
  double grad_norm = 0.0;  // before clipping
  double ms = 0.0;
  double tokens_per_s = 0.0;
  double model_flops_per_s = 0.0;
  std::optional<double> val_loss;
};

class Trainer {
 public:
  // Opens data_dir/train.bin and data_dir/val.bin (val optional), builds and initialises the
  // model from config.seed. Throws ConfigError/IoError naming what is missing and the fix.
  Trainer(TrainConfig config, Arena& arena);

  StepMetrics train_step();
  // Mean token loss over eval_batches batches of the validation file (sequential from its
  // start, so every evaluation sees the same tokens). Requires val.bin.
  double evaluate();
  bool has_validation() const { return val_loader_ != nullptr; }

  const TrainConfig& config() const { return config_; }
  Transformer& model() { return *model_; }
  AdamW& optimizer() { return *optimizer_; }
  int64_t step() const { return step_; }  // updates done so far
  void set_step(int64_t step);            // resume: the next step trains on batch `step`
  // Model FLOPs per trained token: 6·(parameters) + attention (PaLM appendix B: 12·L·C·T).
  double flops_per_token() const;

 private:
  TrainConfig config_;
  Arena& arena_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<TokenLoader> train_loader_;
  std::unique_ptr<TokenLoader> val_loader_;
  LrSchedule schedule_;
  TokenBatch micro_;  // (micro_batch, T)
  int64_t step_ = 0;
};

}  // namespace lattice
