#include "run/training_run.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>

#include "ckpt/checkpoint.h"
#include "comm/thread_world.h"
#include "core/arena.h"
#include "train/test_corpus.h"

namespace lattice {
namespace {

// Two data-parallel ranks of the tiny model; the LR schedule spans 6 steps whatever `steps` is,
// so that a run of 3 steps resumed to 6 is the same run.
TrainConfig two_rank_config(const std::filesystem::path& data, const std::filesystem::path& out) {
  TrainConfig config;
  config.model = model_preset("gpt2-tiny");
  config.data_dir = data.string();
  config.out_dir = out.string();
  config.seq_len = 32;
  config.global_batch = 4;
  config.micro_batches = 1;
  config.decay_steps = 6;
  config.warmup_steps = 1;
  config.eval_batches = 2;
  config.threads = 1;
  config.parallel.dp = 2;
  config.parallel.zero = 1;
  config.parallel.deterministic = true;
  return config;
}

void run_two_ranks(const TrainConfig& config, const RunOptions& options) {
  run_ranks(2, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {.pp = 1, .dp = 2, .tp = 1});
    run_training(config, options, mesh, nullptr);
  });
}

// Every master weight of a checkpoint, read as one rank: its whole flat store.
std::vector<float> checkpoint_weights(const std::filesystem::path& dir) {
  Arena arena("weights");
  std::unique_ptr<Transformer> model = load_checkpoint_model(dir, arena);
  const Tensor& master = model->parameters().master();
  return {master.data<float>(), master.data<float>() + master.numel()};
}

std::vector<std::string> lines_of(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(TrainingRun, WritesPeriodicAndFinalCheckpointsAndOneMetricsRecordPerStep) {
  const auto data = testing::make_corpus_dir("run_periodic");
  const auto out = testing::scratch_dir("run_periodic_out");
  TrainConfig config = two_rank_config(data, out);
  config.steps = 6;
  config.checkpoint_every = 2;
  RunOptions options;
  options.metrics = (out / "metrics.jsonl").string();
  run_two_ranks(config, options);
  // step 6 is the last: the final checkpoint holds it, no periodic one is written then.
  EXPECT_TRUE(std::filesystem::exists(out / "checkpoints" / "step_2" / "manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(out / "checkpoints" / "step_4" / "manifest.json"));
  EXPECT_FALSE(std::filesystem::exists(out / "checkpoints" / "step_6"));
  EXPECT_EQ(read_checkpoint_info(out / "final").step, 6);
  const std::vector<std::string> records = lines_of(out / "metrics.jsonl");
  ASSERT_EQ(records.size(), 6u);
  EXPECT_NE(records.back().find("\"step\":6"), std::string::npos) << records.back();
  EXPECT_NE(records.back().find("val_loss"), std::string::npos) << "the last step evaluates";
}

TEST(TrainingRun, AResumedRunEndsBitwiseEqualToTheUninterruptedOne) {
  const auto data = testing::make_corpus_dir("run_resume");
  const auto whole = testing::scratch_dir("run_resume_whole");
  const auto split = testing::scratch_dir("run_resume_split");
  TrainConfig config = two_rank_config(data, whole);
  config.steps = 6;
  run_two_ranks(config, {});

  TrainConfig first = two_rank_config(data, split);
  first.steps = 3;
  RunOptions first_options;
  first_options.metrics = (split / "metrics.jsonl").string();
  run_two_ranks(first, first_options);
  TrainConfig second = two_rank_config(data, split);
  second.steps = 6;
  RunOptions resume;
  resume.resume = (split / "final").string();
  resume.metrics = first_options.metrics;
  ::testing::internal::CaptureStdout();
  run_two_ranks(second, resume);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  // A run that ignored --resume would train steps 1..6 again and end equal too.
  EXPECT_NE(printed.find("at step 3"), std::string::npos) << printed;
  EXPECT_NE(printed.find("trained 3 steps"), std::string::npos) << printed;

  EXPECT_EQ(read_checkpoint_info(split / "final").step, 6);
  const std::vector<float> expected = checkpoint_weights(whole / "final");
  const std::vector<float> resumed = checkpoint_weights(split / "final");
  ASSERT_EQ(expected.size(), resumed.size());
  EXPECT_EQ(std::memcmp(expected.data(), resumed.data(), expected.size() * sizeof(float)), 0);
  // The resumed run's metrics continue the first run's file: steps 1..6, once each.
  EXPECT_EQ(lines_of(split / "metrics.jsonl").size(), 6u);
}

TEST(TrainingRun, ResumeAutoWithoutAnOutputDirectoryIsAConfigError) {
  const auto data = testing::make_corpus_dir("run_no_out");
  TrainConfig config = two_rank_config(data, "");
  config.steps = 1;
  RunOptions options;
  options.resume = "auto";
  EXPECT_THROW(run_two_ranks(config, options), ConfigError);
}

}  // namespace
}  // namespace lattice
