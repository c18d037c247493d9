// The training run the layout-equivalence tests share (tests/parallel, tests/ckpt): shuffled
// batches from `data`, one warm-up step then cosine decay over `steps` at lr 3e-3, clipping at
// 0.5 (active from the first steps, so the global norm matters), one thread per rank, and the
// batch given as global batch × micro-batches, the micro-batch derived for each layout.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>

#include "train/layout_run.h"
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

// A layout's run against the single rank's: every step's loss within 1e-5 and rank 0's global
// gradient norm within 1e-4 (relative).
inline void expect_equal_to_single_rank(const LayoutRunResult& split,
                                        const LayoutRunResult& single) {
  ASSERT_EQ(split.losses.size(), single.losses.size());
  for (size_t s = 0; s < single.losses.size(); ++s) {
    EXPECT_NEAR(split.losses[s], single.losses[s], 1e-5 * single.losses[s]) << "step " << s + 1;
    const double norm = single.ranks[0].grad_norms[s];
    EXPECT_NEAR(split.ranks[0].grad_norms[s], norm, 1e-4 * norm) << "step " << s + 1;
  }
}

}  // namespace lattice::testing
