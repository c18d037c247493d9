// The non-matmul kernels at GPT-2-small widths (C = 768, F = 3072, V = 50257), one thread.
//
// These kernels are memory-bound, so the baseline measured in the same run is memcpy's
// bandwidth on a buffer far larger than the caches: every kernel reports the bytes it must move
// (compulsory traffic: each input read once, each output written once) per second, and
// `of_memcpy` = that bandwidth / memcpy's (1.0 = as fast as copying the same bytes). Naive
// scalar loops with libm (std::tanh, std::exp) are a second baseline for the kernels whose cost
// is arithmetic: GELU and cross-entropy.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <vector>

#include "core/thread_budget.h"
#include "kernels/activations.h"
#include "kernels/adamw.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/normalization.h"
#include "kernels/rope.h"

namespace lattice {
namespace {

constexpr int64_t kRows = 2048;  // N = B·T: 8 sequences of 256 tokens
constexpr int64_t kWidth = 768;
constexpr int64_t kHidden = 3072;
constexpr int64_t kVocab = 50257;
constexpr int64_t kLossRows = 128;  // cross-entropy rows: 128 × V logits is 25.7 MB in f32

double g_memcpy_bytes_per_second = 0.0;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Best of several 256 MB copies (read + write counted, as for the kernels), in CPU time like
// Google Benchmark's rates, so a busy shared machine skews baseline and kernels alike.
double measure_memcpy_bandwidth() {
  const size_t bytes = size_t(256) << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 0.0;
  for (int i = 0; i < 5; ++i) {
    const double start = thread_cpu_seconds();
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
    const double seconds = thread_cpu_seconds() - start;
    best = std::max(best, 2.0 * double(bytes) / seconds);
  }
  return best;
}

// Bytes moved per iteration → GB/s and the fraction of memcpy's bandwidth.
void report_traffic(benchmark::State& state, double bytes_per_iteration) {
  const double total = bytes_per_iteration * double(state.iterations());
  state.counters["GB/s"] = benchmark::Counter(total * 1e-9, benchmark::Counter::kIsRate);
  state.counters["of_memcpy"] =
      benchmark::Counter(total / g_memcpy_bytes_per_second, benchmark::Counter::kIsRate);
}

Tensor filled(Arena& arena, Shape shape, DType dtype, float low, float high, uint32_t seed) {
  Tensor t = Tensor::empty(arena, shape, dtype);
  std::vector<float> values(size_t(t.numel()));
  uint32_t state = seed;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    v = low + (high - low) * float(state >> 8) * (1.0f / 16777216.0f);
  }
  convert(values.data(), DType::kF32, t.raw_data(), dtype, t.numel());
  return t;
}

double size_of(DType dtype) {
  return double(dtype_size(dtype));
}

void BM_memcpy(benchmark::State& state) {
  const size_t bytes = size_t(kRows * kHidden) * 4;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  report_traffic(state, 2.0 * double(bytes));
}

void BM_layernorm_forward(benchmark::State& state) {
  const DType dtype = DType(state.range(0));
  Arena arena("bench");
  Tensor x = filled(arena, {kRows, kWidth}, dtype, -2, 2, 1);
  Tensor w = filled(arena, {kWidth}, DType::kF32, 0.5, 1.5, 2);
  Tensor b = filled(arena, {kWidth}, DType::kF32, -1, 1, 3);
  Tensor out = Tensor::empty(arena, {kRows, kWidth}, dtype);
  Tensor mean = Tensor::empty(arena, {kRows}, DType::kF32);
  Tensor rstd = Tensor::empty(arena, {kRows}, DType::kF32);
  for (auto _ : state) layernorm_forward(out, mean, rstd, x, w, b);
  report_traffic(state, 2.0 * double(kRows * kWidth) * size_of(dtype));
}

void BM_layernorm_backward(benchmark::State& state) {
  const DType dtype = DType(state.range(0));
  Arena arena("bench");
  Tensor x = filled(arena, {kRows, kWidth}, dtype, -2, 2, 1);
  Tensor dy = filled(arena, {kRows, kWidth}, dtype, -1, 1, 4);
  Tensor w = filled(arena, {kWidth}, DType::kF32, 0.5, 1.5, 2);
  Tensor b = filled(arena, {kWidth}, DType::kF32, -1, 1, 3);
  Tensor out = Tensor::empty(arena, {kRows, kWidth}, dtype);
  Tensor mean = Tensor::empty(arena, {kRows}, DType::kF32);
  Tensor rstd = Tensor::empty(arena, {kRows}, DType::kF32);
  layernorm_forward(out, mean, rstd, x, w, b);
  Tensor dx = Tensor::zeros(arena, {kRows, kWidth}, dtype);
  Tensor dw = Tensor::zeros(arena, {kWidth}, DType::kF32);
  Tensor db = Tensor::zeros(arena, {kWidth}, DType::kF32);
  for (auto _ : state) layernorm_backward(dx, dw, db, dy, x, w, mean, rstd);
  // Reads x, dy, dx; writes dx.
  report_traffic(state, 4.0 * double(kRows * kWidth) * size_of(dtype));
}

void BM_rmsnorm_forward(benchmark::State& state) {
  Arena arena("bench");
  Tensor x = filled(arena, {kRows, kWidth}, DType::kF32, -2, 2, 1);
  Tensor w = filled(arena, {kWidth}, DType::kF32, 0.5, 1.5, 2);
  Tensor out = Tensor::empty(arena, {kRows, kWidth}, DType::kF32);
  Tensor rstd = Tensor::empty(arena, {kRows}, DType::kF32);
  for (auto _ : state) rmsnorm_forward(out, rstd, x, w);
  report_traffic(state, 2.0 * double(kRows * kWidth) * 4.0);
}

void BM_gelu_forward(benchmark::State& state) {
  const DType dtype = DType(state.range(0));
  Arena arena("bench");
  Tensor x = filled(arena, {kRows, kHidden}, dtype, -4, 4, 5);
  Tensor out = Tensor::empty(arena, {kRows, kHidden}, dtype);
  for (auto _ : state) gelu_forward(out, x);
  report_traffic(state, 2.0 * double(kRows * kHidden) * size_of(dtype));
}

// Baseline: the textbook scalar loop with libm's tanh.
void BM_gelu_forward_naive_libm(benchmark::State& state) {
  std::vector<float> x(size_t(kRows * kHidden)), out(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 801) - 400) * 0.01f;
  for (auto _ : state) {
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = x[i];
      out[i] = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
    benchmark::ClobberMemory();
  }
  report_traffic(state, 2.0 * double(x.size()) * 4.0);
}

void BM_gelu_backward(benchmark::State& state) {
  Arena arena("bench");
  Tensor x = filled(arena, {kRows, kHidden}, DType::kF32, -4, 4, 5);
  Tensor dy = filled(arena, {kRows, kHidden}, DType::kF32, -1, 1, 6);
  Tensor dx = Tensor::zeros(arena, {kRows, kHidden}, DType::kF32);
  for (auto _ : state) gelu_backward(dx, dy, x);
  report_traffic(state, 4.0 * double(kRows * kHidden) * 4.0);
}

void BM_swiglu_forward(benchmark::State& state) {
  Arena arena("bench");
  Tensor g = filled(arena, {kRows, kHidden}, DType::kF32, -4, 4, 7);
  Tensor u = filled(arena, {kRows, kHidden}, DType::kF32, -1, 1, 8);
  Tensor out = Tensor::empty(arena, {kRows, kHidden}, DType::kF32);
  for (auto _ : state) swiglu_forward(out, g, u);
  report_traffic(state, 3.0 * double(kRows * kHidden) * 4.0);
}

void BM_cross_entropy_forward(benchmark::State& state) {
  const DType dtype = DType(state.range(0));
  Arena arena("bench");
  Tensor logits = filled(arena, {kLossRows, kVocab}, dtype, -8, 8, 9);
  Tensor targets = Tensor::empty(arena, {kLossRows}, DType::kI32);
  for (int64_t n = 0; n < kLossRows; ++n) targets.data<int32_t>()[n] = int32_t((n * 7919) % kVocab);
  Tensor losses = Tensor::empty(arena, {kLossRows}, DType::kF32);
  for (auto _ : state) cross_entropy_forward(losses, logits, targets);
  report_traffic(state, double(kLossRows * kVocab) * size_of(dtype));
}

// Baseline: max, then Σ exp with libm, then log, one row at a time.
void BM_cross_entropy_forward_naive_libm(benchmark::State& state) {
  std::vector<float> logits(size_t(kLossRows * kVocab)), losses(size_t(kLossRows), 0.0f);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(int(i % 1601) - 800) * 0.01f;
  for (auto _ : state) {
    for (int64_t n = 0; n < kLossRows; ++n) {
      const float* row = logits.data() + n * kVocab;
      const float max = *std::max_element(row, row + kVocab);
      float sum = 0.0f;
      for (int64_t v = 0; v < kVocab; ++v) sum += std::exp(row[v] - max);
      losses[size_t(n)] = std::log(sum) + max - row[(n * 7919) % kVocab];
    }
    benchmark::ClobberMemory();
  }
  report_traffic(state, double(logits.size()) * 4.0);
}

void BM_cross_entropy_backward_in_place(benchmark::State& state) {
  const DType dtype = DType(state.range(0));
  Arena arena("bench");
  Tensor logits = filled(arena, {kLossRows, kVocab}, dtype, -8, 8, 9);
  Tensor targets = Tensor::empty(arena, {kLossRows}, DType::kI32);
  for (int64_t n = 0; n < kLossRows; ++n) targets.data<int32_t>()[n] = int32_t((n * 7919) % kVocab);
  // dlogits overwrites logits, as a training step does; the values stay finite.
  for (auto _ : state) cross_entropy_backward(logits, logits, targets, 1.0f / float(kLossRows));
  report_traffic(state, 2.0 * double(kLossRows * kVocab) * size_of(dtype));
}

// The bf16 step's: f32 logits and the row statistics their forward kept, the gradient written
// straight into the bf16 GEMM operand (range 1), or in place and then cast (range 0, the
// pass it replaced).
void BM_cross_entropy_backward_into_bf16(benchmark::State& state) {
  const bool direct = state.range(0) == 1;
  Arena arena("bench");
  Tensor logits = filled(arena, {kLossRows, kVocab}, DType::kF32, -8, 8, 9);
  const Tensor original = filled(arena, {kLossRows, kVocab}, DType::kF32, -8, 8, 9);
  Tensor targets = Tensor::empty(arena, {kLossRows}, DType::kI32);
  for (int64_t n = 0; n < kLossRows; ++n) targets.data<int32_t>()[n] = int32_t((n * 7919) % kVocab);
  Tensor losses = Tensor::empty(arena, {kLossRows}, DType::kF32);
  Tensor stats = Tensor::empty(arena, {2, kLossRows}, DType::kF32);
  Tensor dlogits = Tensor::empty(arena, {kLossRows, kVocab}, DType::kBF16);
  cross_entropy_forward(losses, logits, targets, kIgnoreIndex, stats);
  const float scale = 1.0f / float(kLossRows);
  for (auto _ : state) {
    if (direct) {
      cross_entropy_backward(dlogits, logits, targets, scale, kIgnoreIndex, stats);
    } else {
      state.PauseTiming();
      logits.copy_from(original);
      state.ResumeTiming();
      cross_entropy_backward(logits, logits, targets, scale, kIgnoreIndex, stats);
      dlogits.copy_from(logits);
    }
  }
  report_traffic(state, double(kLossRows * kVocab) * (direct ? 6.0 : 14.0));
}

void BM_rope_forward(benchmark::State& state) {
  const int64_t batch = 8, seq = 256, heads = 12, head_size = 64;
  Arena arena("bench");
  Tensor x = filled(arena, {batch, seq, heads, head_size}, DType::kF32, -2, 2, 10);
  Tensor out = Tensor::empty(arena, {batch, seq, heads, head_size}, DType::kF32);
  for (auto _ : state) rope_forward(out, x, 10000.0f);
  report_traffic(state, 2.0 * double(x.numel()) * 4.0);
}

void BM_embedding_forward(benchmark::State& state) {
  Arena arena("bench");
  Tensor table = filled(arena, {kVocab, kWidth}, DType::kF32, -1, 1, 11);
  Tensor ids = Tensor::empty(arena, {kRows}, DType::kI32);
  for (int64_t n = 0; n < kRows; ++n) ids.data<int32_t>()[n] = int32_t((n * 104729) % kVocab);
  Tensor out = Tensor::empty(arena, {kRows, kWidth}, DType::kF32);
  for (auto _ : state) embedding_forward(out, ids, table);
  report_traffic(state, 2.0 * double(kRows * kWidth) * 4.0);
}

void BM_embedding_backward(benchmark::State& state) {
  Arena arena("bench");
  Tensor dtable = Tensor::zeros(arena, {kVocab, kWidth}, DType::kF32);
  Tensor ids = Tensor::empty(arena, {kRows}, DType::kI32);
  for (int64_t n = 0; n < kRows; ++n) ids.data<int32_t>()[n] = int32_t((n * 104729) % kVocab);
  Tensor dout = filled(arena, {kRows, kWidth}, DType::kF32, -1, 1, 12);
  for (auto _ : state) embedding_backward(dtable, dout, ids);
  // Reads dout and the touched rows of dtable, writes those rows.
  report_traffic(state, 3.0 * double(kRows * kWidth) * 4.0);
}

void BM_adamw_update(benchmark::State& state) {
  const int64_t n = int64_t(1) << 23;  // 8.4M parameters: 134 MB of state
  const bool with_copy = state.range(0) != 0;
  Arena arena("bench");
  Tensor p = filled(arena, {n}, DType::kF32, -1, 1, 13);
  Tensor g = filled(arena, {n}, DType::kF32, -1, 1, 14);
  Tensor m = Tensor::zeros(arena, {n}, DType::kF32);
  Tensor v = Tensor::zeros(arena, {n}, DType::kF32);
  Tensor copy = with_copy ? Tensor::empty(arena, {n}, DType::kBF16) : Tensor();
  AdamWHyper h;
  h.weight_decay = 0.1f;
  int64_t step = 0;
  for (auto _ : state) adamw_update(p, g, m, v, h, ++step, copy);
  // Reads p, g, m, v; writes p, m, v (+ the bf16 copy).
  report_traffic(state, 7.0 * double(n) * 4.0 + (with_copy ? 2.0 * double(n) : 0.0));
}

void BM_sum_squares(benchmark::State& state) {
  Arena arena("bench");
  Tensor x = filled(arena, {int64_t(1) << 23}, DType::kF32, -1, 1, 15);
  for (auto _ : state) benchmark::DoNotOptimize(sum_squares(x));
  report_traffic(state, double(x.numel()) * 4.0);
}

const int64_t kF32 = int64_t(DType::kF32);
const int64_t kBF16 = int64_t(DType::kBF16);

BENCHMARK(BM_memcpy)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_layernorm_forward)->Arg(kF32)->Arg(kBF16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_layernorm_backward)->Arg(kF32)->Arg(kBF16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rmsnorm_forward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gelu_forward)->Arg(kF32)->Arg(kBF16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gelu_forward_naive_libm)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gelu_backward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_swiglu_forward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cross_entropy_forward)->Arg(kF32)->Arg(kBF16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cross_entropy_forward_naive_libm)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cross_entropy_backward_in_place)->Arg(kF32)->Arg(kBF16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cross_entropy_backward_into_bf16)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rope_forward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_embedding_forward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_embedding_backward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_adamw_update)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_sum_squares)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace lattice

int main(int argc, char** argv) {
  lattice::set_thread_budget(1);
  lattice::g_memcpy_bytes_per_second = lattice::measure_memcpy_bandwidth();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("memcpy_GB/s",
                              std::to_string(lattice::g_memcpy_bytes_per_second * 1e-9));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
