// Exact resume through the trainer: stopping at step k, checkpointing, and continuing in a
// fresh process-like setup gives the same losses and parameters, bit for bit, as never stopping.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "ckpt/checkpoint.h"
#include "train/test_corpus.h"
#include "train/trainer.h"

namespace lattice {
namespace {

TrainConfig resume_config(const std::filesystem::path& data) {
  TrainConfig c;
  c.model = model_preset("llama-tiny");
  c.model.seq_len = 16;
  c.data_dir = data.string();
  c.data_mode = SamplingMode::kShuffled;
  c.seq_len = 16;
  c.micro_batch = 4;
  c.micro_batches = 2;
  c.lr = c.adam.lr = 2e-3f;
  c.warmup_steps = 2;
  c.steps = c.decay_steps = 6;
  c.threads = 1;
  return c;
}

TEST(TrainerResume, StopCheckpointResumeIsBitwiseTheUninterruptedRun) {
  auto data = testing::make_corpus_dir("resume");
  auto root = testing::scratch_dir("resume_ckpts");
  const TrainConfig config = resume_config(data);

  Arena arena_a("uninterrupted");
  Trainer whole(config, arena_a);
  std::vector<double> expected;
  for (int s = 0; s < 6; ++s) expected.push_back(whole.train_step().loss);

  std::filesystem::path dir;
  {
    Arena arena_b("first half");
    Trainer first(config, arena_b);
    for (int s = 0; s < 3; ++s) EXPECT_EQ(first.train_step().loss, expected[size_t(s)]);
    TrainingState state{.step = first.step(),
                        .lr_step = first.step(),
                        .data = first.data_position(),
                        .seed = config.seed};
    dir = save_training_checkpoint(root, config, first.model(), first.optimizer(), state);
  }
  auto choice = resume_auto(root);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->dir, dir);

  Arena arena_c("second half");
  TrainConfig other_seed = config;
  Trainer second(other_seed, arena_c);  // fresh weights, overwritten by the load
  TrainingState state = load_training_checkpoint(dir, second.model(), second.optimizer());
  EXPECT_EQ(state.step, 3);
  second.set_step(state.step);
  EXPECT_TRUE(state.data == second.data_position());  // the loader continues at batch 3
  EXPECT_EQ(state.data.index, 3 * 8);                 // 3 global batches of 8 sequences
  for (int s = 3; s < 6; ++s) EXPECT_EQ(second.train_step().loss, expected[size_t(s)]) << s;
  const Tensor& a = whole.model().parameters().master();
  const Tensor& b = second.model().parameters().master();
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(whole.optimizer().v().raw_data(), second.optimizer().v().raw_data(),
                        whole.optimizer().v().nbytes()),
            0);
}

}  // namespace
}  // namespace lattice
