#include "train/train_benchmark.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/arena.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/statistics.h"
#include "core/tensor.h"
#include "core/thread_budget.h"
#include "core/timer.h"
#include "kernels/matmul.h"
#include "model/transformer.h"
#include "train/grad_norm.h"
#include "train/optimizer.h"

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

void fill_random_tokens(Tensor& tokens, Tensor& targets, int64_t vocab, uint64_t seed) {
  PhiloxStream stream(seed, kTokenKey);
  for (Tensor* t : {&tokens, &targets}) {
    int32_t* data = t->data<int32_t>();
    for (int64_t i = 0; i < t->numel(); ++i) data[i] = int32_t(stream.next_below(uint64_t(vocab)));
  }
}

TrainBenchmarkResult run_train_benchmark(const TrainBenchmarkConfig& config) {
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
  set_thread_budget(config.threads);
  Arena arena("bench-train");
  Transformer model(config.model, arena, config.precision);
  model.initialize(config.seed);
  AdamW optimizer(model.parameters(), arena, AdamWHyper{.weight_decay = 0.1f});  // as TrainConfig
  Tensor tokens = Tensor::empty(arena, Shape({config.batch, config.seq}), DType::kI32);
  Tensor targets = Tensor::empty(arena, Shape({config.batch, config.seq}), DType::kI32);
  fill_random_tokens(tokens, targets, config.model.vocab_size, config.seed);

  TrainBenchmarkResult result;
  result.parameters = model.registry().total_elements();
  result.flops_per_token = model_flops_per_token(result.parameters, config.model.n_layer,
                                                 config.model.d_model, config.seq);
  const double tokens_per_step = double(config.batch * config.seq);
  for (int step = 0; step < config.warmup_steps + config.steps; ++step) {
    Stopwatch watch;
    // ---- training section (Trainer::train_step with one micro-batch) ----
    ParameterStore& params = model.parameters();
    params.zero_grads();
    const ForwardResult r = model.forward(tokens, targets);
    model.backward(float(1.0 / tokens_per_step));
    const double grad_norm = std::sqrt(grad_sum_squares(params.grads()));
    grad_norm_clip(params.grads(), grad_norm, 1.0f);
    optimizer.step(config.lr);
    // ---- end of training section ----
    const double ms = watch.milliseconds();
    result.losses.push_back(r.loss_sum / tokens_per_step);
    if (step >= config.warmup_steps) result.step_ms.push_back(ms);
  }
  return result;
}

double measure_gemm_flops(GemmShape shape, DType dtype, int threads, int repeats) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    LATTICE_THROW(DTypeError, "measure_gemm_flops: dtype {} ---> HINT: f32 or bf16",
                  dtype_name(dtype));
  }
  LATTICE_CHECK(shape.m > 0 && shape.k > 0 && shape.n > 0 && repeats > 0 && threads > 0);
  set_thread_budget(threads);
  Arena arena("bench-gemm");
  const Tensor a = random_matrix(arena, shape.m, shape.k, dtype, 1, 0);
  const Tensor b = random_matrix(arena, shape.k, shape.n, dtype, 2, 0);
  Tensor out = Tensor::empty(arena, Shape({shape.m, shape.n}), dtype, MemoryCategory::kWorkspace);
  matmul(out, a, b);  // warm-up: creates the primitive, faults the pages in
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < repeats; ++i) {
    Stopwatch watch;
    matmul(out, a, b);
    best = std::min(best, watch.seconds());
  }
  if (!all_finite(out)) {
    LATTICE_THROW(ValueError, "measure_gemm_flops: non-finite output for M {} K {} N {}", shape.m,
                  shape.k, shape.n);
  }
  return shape.flops() / best;
}

}  // namespace lattice
