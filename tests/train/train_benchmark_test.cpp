#include "train/train_benchmark.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "test_corpus.h"
#include "train/trainer.h"

namespace lattice {
namespace {

TEST(TrainBenchmark, ModelFlopsPerTokenIsSixNPlusAttention) {
  ModelConfig c = model_preset("gpt2-124m");
  // 6·N + 12·L·C·T with N = 124,439,808 (tied GPT-2 small), L 12, C 768, T 256.
  EXPECT_DOUBLE_EQ(model_flops_per_token(124439808, c.n_layer, c.d_model, 256),
                   6.0 * 124439808 + 12.0 * 12 * 768 * 256);
}

// `lattice train` and `lattice bench train` report the MFU of one formula (the planner's too,
// tests/plan/time_model_test.cpp): the Trainer once halved the attention term.
TEST(TrainBenchmark, TheTrainerCountsTheSameModelFlops) {
  TrainConfig config;
  config.model = model_preset("gpt2-tiny");
  config.data_dir = testing::make_corpus_dir("flops_per_token").string();
  config.seq_len = 32;
  config.global_batch = 2;
  config.micro_batches = 1;
  config.threads = 1;
  Arena arena("flops");
  Trainer trainer(config, arena);
  TrainBenchmarkConfig bench;
  bench.model = config.model;
  bench.batch = 1;
  bench.seq = 32;
  bench.warmup_steps = 0;
  bench.steps = 1;
  const TrainBenchmarkResult r = run_train_benchmark(bench);
  EXPECT_EQ(r.parameters, trainer.model().registry().global_elements());
  EXPECT_DOUBLE_EQ(trainer.flops_per_token(), r.flops_per_token);
  EXPECT_DOUBLE_EQ(r.flops_per_token, 6.0 * double(r.parameters) + 12.0 * 2 * 64 * 32);
}

TEST(TrainBenchmark, TinyModelRunsEveryStepAndLearns) {
  TrainBenchmarkConfig config;
  config.model = model_preset("gpt2-tiny");
  config.batch = 2;
  config.seq = 16;
  config.warmup_steps = 1;
  config.steps = 3;
  config.lr = 1e-2f;  // large enough that the repeated batch's loss visibly falls
  for (DType precision : {DType::kF32, DType::kBF16}) {
    config.precision = precision;
    const TrainBenchmarkResult r = run_train_benchmark(config);
    ASSERT_EQ(r.step_ms.size(), 3u);
    ASSERT_EQ(r.losses.size(), 4u);
    for (double ms : r.step_ms) EXPECT_GT(ms, 0.0);
    // Random tokens over V = 256 at initialisation: the loss starts near ln(256) = 5.545, and
    // the same batch repeated must not get worse under AdamW.
    EXPECT_NEAR(r.losses.front(), std::log(256.0), 0.1);
    EXPECT_LT(r.losses.back(), r.losses.front());
    EXPECT_EQ(r.parameters, 2 * (12 * 64 * 64 + 13 * 64) + 256 * 64 + 64 * 64 + 2 * 64);
    EXPECT_GT(r.tokens_per_s(32), 0.0);
  }
}

// `lattice bench train` times the Trainer's own step: the same losses, bit for bit, as a Trainer
// built on the benchmark's config and tokens (in memory, no data files).
TEST(TrainBenchmark, TimesTheTrainersOwnStep) {
  TrainBenchmarkConfig bench;
  bench.model = model_preset("gpt2-tiny");
  bench.batch = 2;
  bench.seq = 16;
  bench.warmup_steps = 1;
  bench.steps = 2;
  bench.lr = 1e-2f;
  const TrainBenchmarkResult r = run_train_benchmark(bench);
  Arena arena("trainer");
  Trainer trainer(
      benchmark_train_config(bench), arena, {},
      {.train = random_token_file(bench.batch, bench.seq, bench.model.vocab_size, bench.seed),
       .val = {}});
  ASSERT_EQ(r.losses.size(), 3u);
  for (double loss : r.losses) EXPECT_EQ(trainer.train_step().loss, loss);
  EXPECT_FALSE(trainer.has_validation());
}

TEST(TrainBenchmark, MedianOfEvenAndOddCounts) {
  TrainBenchmarkResult r;
  r.step_ms = {5, 1, 3};
  EXPECT_DOUBLE_EQ(r.median_ms(), 3.0);
  r.step_ms = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(r.median_ms(), 2.5);
  EXPECT_DOUBLE_EQ(r.tokens_per_s(100), 100 / 2.5e-3);
}

TEST(TrainBenchmark, RejectsASequenceLongerThanTheContext) {
  TrainBenchmarkConfig config;
  config.model = model_preset("gpt2-tiny");  // seq_len 64
  config.seq = 65;
  EXPECT_THROW(run_train_benchmark(config), ValueError);
}

TEST(TrainBenchmark, GemmThroughputIsPositiveForBothPrecisions) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const double flops = measure_gemm_flops({.m = 32, .k = 48, .n = 64}, dtype, 1, 2);
    EXPECT_GT(flops, 0.0);
    EXPECT_TRUE(std::isfinite(flops));
  }
  EXPECT_THROW(measure_gemm_flops({.m = 8, .k = 8, .n = 8}, DType::kI32, 1, 1), DTypeError);
}

// One time per library the build has, each positive, and the library chosen before is chosen
// again, after a failure too.
TEST(TrainBenchmark, AGemmIsTimedInEveryLibraryAndTheChoiceIsKept) {
  const GemmProblem problem{.m = 32, .k = 48, .n = 64, .transpose_b = true};
  const std::map<GemmLibrary, double> seconds = measure_gemm_seconds_per_library(problem, 1, 2);
  ASSERT_EQ(seconds.size(), available_gemm_libraries().size());
  for (const GemmLibrary library : available_gemm_libraries()) {
    ASSERT_TRUE(seconds.contains(library)) << gemm_library_key(library);
    EXPECT_GT(seconds.at(library), 0.0) << gemm_library_key(library);
  }
  EXPECT_EQ(gemm_library(), GemmLibrary::kOneDnn);
  // The last library in the build chosen, then a problem that fails in the first one measured.
  const GemmLibrary last = available_gemm_libraries().back();
  set_gemm_library(last);
  const GemmProblem bad{.m = 8, .k = 8, .n = 8, .input = DType::kI32, .output = DType::kI32};
  EXPECT_THROW(measure_gemm_seconds_per_library(bad, 1, 1), DTypeError);
  EXPECT_EQ(gemm_library(), last);
  set_gemm_library(GemmLibrary::kOneDnn);
}

}  // namespace
}  // namespace lattice
