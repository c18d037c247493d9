// Causal grouped-query attention, forward and backward, on one thread, for GPT-2-small heads
// (B = 4, NH = NKV = 12, HS = 64) at T = 256 and 1024 and for the demo model's small heads
// (B = 12, NH = NKV = 4, HS = 32, T = 64: one tile, all on the diagonal), f32 and bf16 inputs.
//
// Reported as GFLOP/s of causal work (forward 2·2·B·NH·T²·HS/2: QKᵀ and PV over the lower
// triangle; backward 2.5× that: five products instead of two) and as a fraction of this
// machine's single-core fp32 FMA peak, measured first in the same binary by independent
// chains of _mm512_fmadd_ps (core/cpu_peak.h; also reported as the FmaPeak benchmark). Rates
// are on the benchmark thread's CPU time (Google Benchmark's default): the machine is shared,
// and CPU time leaves out the slices in which another process ran on this core.
//
//   build-*/bench/attention_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cpu_peak.h"
#include "core/philox.h"
#include "core/thread_budget.h"
#include "kernels/attention.h"

namespace lattice {
namespace {

// ---- the baseline: fp32 AVX-512 FMA peak of one core (core/cpu_peak.h) ----

// Rounds of the peak loop per measurement: ~4 ms, long against the timer's resolution.
constexpr int64_t kPeakRepeats = int64_t(1) << 17;

double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Best of 20 runs, in GFLOP/s of the calling thread's CPU time (as the benchmarks report);
// 0 without AVX-512.
double measure_fma_peak_gflops() {
  if (!has_avx512_fma()) return 0;
  double best = 0;
  for (int run = 0; run < 20; ++run) {
    float start = 1.0f;
    benchmark::DoNotOptimize(start);  // opaque input: the loop really runs every time
    const double begin = thread_seconds();
    float result = fp32_fma_loop(start, kPeakRepeats);
    benchmark::DoNotOptimize(result);
    const double seconds = thread_seconds() - begin;
    best = std::max(best, fp32_fma_flops(kPeakRepeats) / seconds * 1e-9);
  }
  return best;
}

double peak_gflops = 0;  // set in main before any benchmark runs

// The same loop as a benchmark, so the peak shows in the table beside the attention rows.
void BM_FmaPeak(benchmark::State& state) {
  if (!has_avx512_fma()) {
    state.SkipWithError("this CPU has no AVX-512");
    return;
  }
  for (auto _ : state) {
    float start = 1.0f;
    benchmark::DoNotOptimize(start);
    float result = fp32_fma_loop(start, kPeakRepeats);
    benchmark::DoNotOptimize(result);
  }
  const double gflop = fp32_fma_flops(kPeakRepeats) * 1e-9;
  state.counters["GFLOP/s"] =
      benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_frac"] =
      benchmark::Counter(gflop / peak_gflops, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond);

// ---- attention ----

// GPT-2 small's heads, and the demo's (configs/shakespeare-char.toml).
struct HeadShape {
  int64_t batch, heads, head_size;
};
constexpr HeadShape kGpt2Heads{4, 12, 64};
constexpr HeadShape kDemoHeads{12, 4, 32};

struct AttentionProblem {
  AttentionProblem(const HeadShape& shape, int64_t T, DType dtype) : arena("attention_bench") {
    q = Tensor::empty(arena, {shape.batch, T, shape.heads, shape.head_size}, dtype);
    k = Tensor::empty(arena, q.shape(), dtype);
    v = Tensor::empty(arena, q.shape(), dtype);
    dout = Tensor::empty(arena, q.shape(), dtype);
    out = Tensor::empty(arena, q.shape(), dtype);
    lse = Tensor::empty(arena, {shape.batch, shape.heads, T}, DType::kF32);
    dq = Tensor::zeros(arena, q.shape(), dtype);
    dk = Tensor::zeros(arena, q.shape(), dtype);
    dv = Tensor::zeros(arena, q.shape(), dtype);
    uint64_t key = 1;
    for (Tensor* t : {&q, &k, &v, &dout}) {
      std::vector<float> values(size_t(t->numel()));
      fill_uniform(values.data(), t->numel(), 7, key++, 0, -1.0f, 1.0f);
      convert(values.data(), DType::kF32, t->raw_data(), dtype, t->numel());
    }
    attention_forward(out, lse, q, k, v);
  }
  void forward() { attention_forward(out, lse, q, k, v); }
  void backward() { attention_backward(dq, dk, dv, dout, q, k, v, out, lse); }

  Arena arena;
  Tensor q, k, v, dout, out, lse, dq, dk, dv;
};

double forward_gflop(const HeadShape& shape, int64_t T) {
  return 2.0 * 2.0 * double(shape.batch * shape.heads) * double(T) * double(T) *
         double(shape.head_size) / 2.0 * 1e-9;
}

enum class Pass { kForward, kBackward, kForwardBackward };

void run_attention(benchmark::State& state, Pass pass) {
  const int64_t T = state.range(0);
  const DType dtype = state.range(1) == 0 ? DType::kF32 : DType::kBF16;
  const HeadShape shape = T == 64 ? kDemoHeads : kGpt2Heads;
  set_thread_budget(1);
  AttentionProblem problem(shape, T, dtype);
  for (auto _ : state) {
    if (pass != Pass::kBackward) problem.forward();
    if (pass != Pass::kForward) problem.backward();
    benchmark::ClobberMemory();
  }
  const double gflop = forward_gflop(shape, T) * (pass == Pass::kForward    ? 1.0
                                                  : pass == Pass::kBackward ? 2.5
                                                                            : 3.5);
  state.SetLabel(std::string(dtype_name(dtype)) + (T == 64 ? " demo heads" : " gpt2 heads"));
  state.counters["GFLOP/s"] =
      benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
  if (peak_gflops > 0) {
    state.counters["peak_frac"] =
        benchmark::Counter(gflop / peak_gflops, benchmark::Counter::kIsIterationInvariantRate);
  }
}

void BM_AttentionForward(benchmark::State& state) {
  run_attention(state, Pass::kForward);
}
void BM_AttentionBackward(benchmark::State& state) {
  run_attention(state, Pass::kBackward);
}
void BM_AttentionForwardBackward(benchmark::State& state) {
  run_attention(state, Pass::kForwardBackward);
}

// Args: {T, 0 = f32 / 1 = bf16}; T = 64 is the demo's heads, the others GPT-2's.
void attention_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"T", "bf16"});
  for (int64_t T : {64, 256, 1024}) {
    for (int64_t bf16 : {0, 1}) b->Args({T, bf16});
  }
  b->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_AttentionForward)->Apply(attention_args);
BENCHMARK(BM_AttentionBackward)->Apply(attention_args);
BENCHMARK(BM_AttentionForwardBackward)->Apply(attention_args);

}  // namespace
}  // namespace lattice

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  lattice::peak_gflops = lattice::measure_fma_peak_gflops();
  benchmark::AddCustomContext("fp32_fma_peak_gflops_one_core",
                              fmt::format("{:.1f}", lattice::peak_gflops));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
