// Measurements behind `lattice bench train` and `lattice bench calibrate`: the wall time of full
// training steps (forward + backward + grad-norm clip + AdamW) of a model on random tokens, and
// the throughput of one lattice::matmul shape, both on a given thread budget.
//
// The step is the Trainer's own (train_step, one micro-batch) on tokens in memory: Philox draws
// over the vocabulary, one batch of windows repeated every step.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "core/dtype.h"
#include "core/kernel_profile.h"
#include "core/model_flops.h"
#include "data/token_file.h"
#include "model/config.h"
#include "train/train_config.h"

namespace lattice {

struct TrainBenchmarkConfig {
  ModelConfig model;
  int64_t batch = 4;  // B sequences per step
  int64_t seq = 256;  // T tokens per sequence (<= model.seq_len)
  int warmup_steps = 2;
  int steps = 5;                  // timed steps
  DType precision = DType::kF32;  // compute dtype: kF32, or kBF16 with fp32 master weights
  GemmLibrary gemm_library = GemmLibrary::kOneDnn;  // the library of every matmul in the steps
  int threads = 1;
  uint64_t seed = 1337;
  float lr = 1e-4f;  // AdamW learning rate of every step (constant)
  // The timed steps' kernels (core/kernel_profile.h) are added here; null: not profiled.
  KernelProfile* profile = nullptr;
};

struct TrainBenchmarkResult {
  std::vector<double> step_ms;  // each timed step
  std::vector<double> losses;   // loss of every step, warm-up included (finite when all is well)
  int64_t parameters = 0;
  double flops_per_token = 0;  // core/model_flops.h
  double median_ms() const;
  double tokens_per_s(int64_t tokens_per_step) const;
};

// `batch` windows of `seq` tokens (batch · seq + 1 tokens), uniform over the vocabulary, a
// function of the seed (the same on every rank): one global batch of a sequential loader.
std::shared_ptr<const TokenFile> random_token_file(int64_t batch, int64_t seq, int64_t vocab,
                                                   uint64_t seed);

// The Trainer's config of a benchmark: one micro-batch of `batch` sequences of `seq` tokens, a
// constant learning rate, the precision and thread budget given, no data files, no checkpoints.
// ValueError when seq lies outside the model's context or a count is not positive.
TrainConfig benchmark_train_config(const TrainBenchmarkConfig& config);

TrainBenchmarkResult run_train_benchmark(const TrainBenchmarkConfig& config);

struct GemmShape {
  int64_t m = 0, k = 0, n = 0;  // out (M, N) = a (M, K) @ b (K, N)
  double flops() const { return 2.0 * double(m) * double(k) * double(n); }
};

// Best FLOP/s of `repeats` timed calls (after one warm-up call) of lattice::matmul on `shape`,
// inputs and output of `dtype` (kF32, or kBF16 with fp32 accumulation), on `threads` threads.
// Inputs are uniform in [-1, 1); the result of the calls is checked for finiteness.
double measure_gemm_flops(GemmShape shape, DType dtype, int threads, int repeats);

// Best wall seconds of `repeats` timed calls (after a warm-up call) of lattice::matmul on one
// problem exactly as a training step posed it (transposes, accumulation, bias, dtypes), alone,
// on `threads` threads: the library's own rate for that shape, beside the step's.
double measure_gemm_seconds(const GemmProblem& problem, int threads, int repeats);

// The same problem timed in every GEMM library the build has (kernels/matmul.h: oneDNN, and
// oneMKL where setup unpacked it), best wall seconds each; the library chosen before is chosen
// again afterwards.
std::map<GemmLibrary, double> measure_gemm_seconds_per_library(const GemmProblem& problem,
                                                               int threads, int repeats);

}  // namespace lattice
