// The training run the layout-equivalence tests share (tests/parallel, tests/ckpt): shuffled
// batches from `data`, one warm-up step then cosine decay over `steps` at lr 3e-3, clipping at
// 0.5 (active from the first steps, so the global norm matters), one thread per rank, and the
// batch given as global batch × micro-batches, the micro-batch derived for each layout.
#pragma once

#include <filesystem>

#include "train/train_config.h"

namespace lattice::testing {

struct EquivalenceRun {
  int64_t seq_len = 12;
  int64_t global_batch = 8;
  int64_t micro_batches = 2;
  int64_t steps = 10;
};

// `model` is used as given (its seq_len must cover run.seq_len).
inline TrainConfig equivalence_config(ModelConfig model, const std::filesystem::path& data,
                                      EquivalenceRun run = {}) {
  TrainConfig c;
  c.model = std::move(model);
  c.data_dir = data.string();
  c.data_mode = SamplingMode::kShuffled;
  c.seq_len = run.seq_len;
  c.global_batch = run.global_batch;
  c.micro_batches = run.micro_batches;
  c.micro_batch = 0;
  c.lr = 3e-3f;
  c.min_lr = 3e-4f;
  c.warmup_steps = 1;
  c.steps = c.decay_steps = run.steps;
  c.adam.lr = c.lr;
  c.grad_clip = 0.5f;
  c.threads = 1;
  return c;
}

}  // namespace lattice::testing
