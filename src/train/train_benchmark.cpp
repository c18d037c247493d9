#include "train/train_benchmark.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "core/arena.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/statistics.h"
#include "core/tensor.h"
#include "core/thread_budget.h"
#include "core/timer.h"
#include "kernels/matmul.h"
#include "train/trainer.h"

namespace lattice {

namespace {

// Philox keys of the benchmark's random inputs (distinct from the model's initialisation).
constexpr uint64_t kTokenKey = 0x62656e6368746f6bull;  // "benchtok"
constexpr uint64_t kGemmKey = 0x62656e636867656dull;   // "benchgem"

Tensor random_matrix(Arena& arena, int64_t rows, int64_t cols, DType dtype, uint64_t seed,
                     uint64_t offset) {
  std::vector<float> values(size_t(rows * cols));
  fill_uniform(values.data(), rows * cols, seed, kGemmKey, int64_t(offset), -1.0f, 1.0f);
  Tensor t = Tensor::empty(arena, Shape({rows, cols}), dtype, MemoryCategory::kWorkspace);
  if (dtype == DType::kF32) {
    std::copy(values.begin(), values.end(), t.data<float>());
  } else {
    bf16* out = t.data<bf16>();
    for (size_t i = 0; i < values.size(); ++i) out[i] = bf16(values[i]);
  }
  return t;
}

bool all_finite(const Tensor& t) {
  const int64_t n = t.numel();
  if (t.dtype() == DType::kF32) {
    const float* p = t.data<float>();
    return std::all_of(p, p + n, [](float v) { return std::isfinite(v); });
  }
  const bf16* p = t.data<bf16>();
  return std::all_of(p, p + n, [](bf16 v) { return std::isfinite(float(v)); });
}

}  // namespace

double TrainBenchmarkResult::median_ms() const {
  return median(step_ms);
}

double TrainBenchmarkResult::tokens_per_s(int64_t tokens_per_step) const {
  return double(tokens_per_step) / (median_ms() / 1e3);
}

std::shared_ptr<const TokenFile> random_token_file(int64_t batch, int64_t seq, int64_t vocab,
                                                   uint64_t seed) {
  LATTICE_CHECK(vocab > 0 && vocab <= kTokenFileMaxVocab);
  std::vector<uint16_t> tokens(size_t(batch * seq + 1));
  PhiloxStream stream(seed, kTokenKey);
  for (uint16_t& t : tokens) t = uint16_t(stream.next_below(uint64_t(vocab)));
  return std::make_shared<const TokenFile>(std::move(tokens), "<random tokens>");
}

TrainConfig benchmark_train_config(const TrainBenchmarkConfig& config) {
  if (config.seq <= 0 || config.seq > config.model.seq_len) {
    LATTICE_THROW(ValueError,
                  "bench train: seq {} is outside 1..{} (the model's context) ---> HINT: pass "
                  "a smaller --seq",
                  config.seq, config.model.seq_len);
  }
  if (config.batch <= 0 || config.steps <= 0 || config.warmup_steps < 0 || config.threads <= 0) {
    LATTICE_THROW(ValueError,
                  "bench train: batch {}, steps {}, warm-up {} and threads {} must be positive "
                  "(warm-up may be 0)",
                  config.batch, config.steps, config.warmup_steps, config.threads);
  }
  TrainConfig train;
  train.model = config.model;
  train.micro_batch = config.batch;
  train.micro_batches = 1;
  train.seq_len = config.seq;
  train.lr = train.min_lr = config.lr;  // constant
  train.steps = config.warmup_steps + config.steps;
  train.compute_dtype = config.precision;
  train.gemm_library = config.gemm_library;
  train.seed = config.seed;
  train.threads = config.threads;
  return train;
}

TrainBenchmarkResult run_train_benchmark(const TrainBenchmarkConfig& config) {
  const TrainConfig train = benchmark_train_config(config);
  Arena arena("bench-train");
  Trainer trainer(
      train, arena, {},
      {.train = random_token_file(config.batch, config.seq, config.model.vocab_size, config.seed),
       .val = {}});
  TrainBenchmarkResult result;
  result.parameters = trainer.model().registry().total_elements();
  result.flops_per_token = trainer.flops_per_token();
  for (int step = 0; step < config.warmup_steps + config.steps; ++step) {
    std::optional<ScopedKernelProfile> profiled;
    if (config.profile != nullptr && step >= config.warmup_steps) profiled.emplace(*config.profile);
    const StepMetrics m = trainer.train_step();
    result.losses.push_back(m.loss);
    if (step >= config.warmup_steps) result.step_ms.push_back(m.ms);
  }
  return result;
}

double measure_gemm_seconds(const GemmProblem& problem, int threads, int repeats) {
  for (const DType d : {problem.input, problem.output}) {
    if (d != DType::kF32 && d != DType::kBF16) {
      LATTICE_THROW(DTypeError, "measure_gemm_seconds: dtype {} ---> HINT: f32 or bf16",
                    dtype_name(d));
    }
  }
  LATTICE_CHECK(problem.m > 0 && problem.k > 0 && problem.n > 0 && repeats > 0 && threads > 0);
  set_thread_budget(threads);
  Arena arena("bench-gemm");
  // The operands as the caller stores them: a (K, M) under transpose_a, b (N, K) under
  // transpose_b.
  const Tensor a = problem.transpose_a
                       ? random_matrix(arena, problem.k, problem.m, problem.input, 1, 0)
                       : random_matrix(arena, problem.m, problem.k, problem.input, 1, 0);
  const Tensor b = problem.transpose_b
                       ? random_matrix(arena, problem.n, problem.k, problem.input, 2, 0)
                       : random_matrix(arena, problem.k, problem.n, problem.input, 2, 0);
  const Tensor bias =
      problem.bias ? random_matrix(arena, 1, problem.n, DType::kF32, 3, 0).view(Shape({problem.n}))
                   : Tensor();
  Tensor out = random_matrix(arena, problem.m, problem.n, problem.output, 4, 0);
  const MatmulOptions options{.transpose_a = problem.transpose_a,
                              .transpose_b = problem.transpose_b,
                              .accumulate = problem.accumulate};
  matmul(out, a, b, bias, options);  // warm-up: creates the primitive, faults the pages in
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < repeats; ++i) {
    Stopwatch watch;
    matmul(out, a, b, bias, options);
    best = std::min(best, watch.seconds());
  }
  if (!all_finite(out)) {
    LATTICE_THROW(ValueError, "measure_gemm_seconds: non-finite output for M {} K {} N {}",
                  problem.m, problem.k, problem.n);
  }
  return best;
}

std::map<GemmLibrary, double> measure_gemm_seconds_per_library(const GemmProblem& problem,
                                                               int threads, int repeats) {
  const GemmLibrary chosen = gemm_library();
  std::map<GemmLibrary, double> seconds;
  try {
    for (const GemmLibrary library : available_gemm_libraries()) {
      set_gemm_library(library);
      seconds[library] = measure_gemm_seconds(problem, threads, repeats);
    }
  } catch (...) {
    set_gemm_library(chosen);
    throw;
  }
  set_gemm_library(chosen);
  return seconds;
}

double measure_gemm_flops(GemmShape shape, DType dtype, int threads, int repeats) {
  const GemmProblem problem{
      .m = shape.m, .k = shape.k, .n = shape.n, .input = dtype, .output = dtype};
  return problem.flops() / measure_gemm_seconds(problem, threads, repeats);
}

}  // namespace lattice
