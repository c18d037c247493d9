// GEMM throughput of lattice::matmul (oneDNN) on the shapes of a GPT-2-small step, against this
// machine's measured peaks, in one run.
//
//   out (M, N) = a (M, K) @ b (K, N), M = B·T tokens; (K, N) per layer:
//     (768, 2304) qkv projection   (768, 768) attention output   (768, 3072) MLP up
//     (3072, 768) MLP down         (768, 50304) logits (padded vocabulary)
//   in f32 (f32 out) and bf16 (bf16 out, fp32 accumulation), plus the square 2048 f32 GEMM.
//
// Baselines measured in the same run: fp32_fma_peak (AVX-512 FMA loop, core/cpu_peak.h),
// bf16_dot_peak (AVX512-BF16 VDPBF16PS loop) and the best bf16 GEMM of the run (the practical
// bf16 ceiling). first_call/* times a call that creates its primitive (caches emptied) against
// the steady-state rows of the same shape; prepare/* times the creation alone. A summary with the
// targets follows the table.
//
// Single thread by default (--lattice_threads=N to change), e.g.
//   OMP_NUM_THREADS=1 build/bench/gemm_bench --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "core/cpu_peak.h"
#include "core/philox.h"
#include "core/thread_budget.h"
#include "kernels/matmul.h"

namespace lattice {
namespace {

constexpr char kFp32PeakName[] = "fp32_fma_peak";
constexpr char kBf16PeakName[] = "bf16_dot_peak";
// Rounds of the peak loops per benchmark iteration: ~1 ms, long against the timer overhead.
constexpr int64_t kPeakRepeats = int64_t(1) << 16;

struct GemmCase {
  int64_t m, k, n;
  DType input, output;
  std::string name() const {
    return fmt::format("gemm_{}/M:{}/K:{}/N:{}", dtype_name(input), m, k, n);
  }
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

// The GPT-2-small shapes (header comment) at M = B·T of 1024 and 4096, then square 2048.
std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  const int64_t layer_kn[][2] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 50304}};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t m : {1024, 4096}) {
      for (auto [k, n] : layer_kn) cases.push_back({m, k, n, dtype, dtype});
    }
  }
  cases.push_back({2048, 2048, 2048, DType::kF32, DType::kF32});
  return cases;
}

// Operands of one case with deterministic values in [-1, 1), kept for all of its iterations.
struct GemmOperands {
  std::vector<std::byte> a, b, out;
  Tensor a_tensor, b_tensor, out_tensor;

  explicit GemmOperands(const GemmCase& c) {
    a_tensor = make(a, c.m, c.k, c.input, 1);
    b_tensor = make(b, c.k, c.n, c.input, 2);
    out_tensor = make(out, c.m, c.n, c.output, 3);  // filled, so no first-touch page faults
  }
  static Tensor make(std::vector<std::byte>& storage, int64_t rows, int64_t cols, DType dtype,
                     uint64_t key) {
    std::vector<float> values(size_t(rows * cols));
    fill_uniform(values.data(), rows * cols, 2024, key, 0, -1.0f, 1.0f);
    storage.resize(values.size() * dtype_size(dtype));
    Tensor t = Tensor::borrow(storage.data(), {rows, cols}, dtype);
    t.copy_from(Tensor::borrow(values.data(), {rows, cols}, DType::kF32));
    return t;
  }
};

void gemm_counters(benchmark::State& state, const GemmCase& c) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(c.flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void bm_gemm(benchmark::State& state, GemmCase c) {
  GemmOperands operands(c);
  matmul(operands.out_tensor, operands.a_tensor, operands.b_tensor);  // prepare once, untimed
  for (auto _ : state) {
    matmul(operands.out_tensor, operands.a_tensor, operands.b_tensor);
    benchmark::ClobberMemory();
  }
  gemm_counters(state, c);
  state.SetLabel(matmul_implementation(c.m, c.n, c.k, c.input, c.output));
}

// Preparing a problem alone (primitive descriptor + primitive, i.e. oneDNN's JIT), with both
// caches emptied before each timed call.
void bm_prepare(benchmark::State& state, GemmCase c) {
  int capacity = dnnl::get_primitive_cache_capacity();
  dnnl::set_primitive_cache_capacity(0);
  for (auto _ : state) {
    state.PauseTiming();
    matmul_cache_clear();
    state.ResumeTiming();
    benchmark::DoNotOptimize(matmul_implementation(c.m, c.n, c.k, c.input, c.output));
  }
  dnnl::set_primitive_cache_capacity(capacity);
}

// A call that must create its primitive: our per-thread cache and oneDNN's global primitive
// cache are both emptied before each timed call.
void bm_first_call(benchmark::State& state, GemmCase c) {
  GemmOperands operands(c);
  int capacity = dnnl::get_primitive_cache_capacity();
  dnnl::set_primitive_cache_capacity(0);
  for (auto _ : state) {
    state.PauseTiming();
    matmul_cache_clear();
    state.ResumeTiming();
    matmul(operands.out_tensor, operands.a_tensor, operands.b_tensor);
    benchmark::ClobberMemory();
  }
  dnnl::set_primitive_cache_capacity(capacity);
  gemm_counters(state, c);
}

void bm_fp32_fma_peak(benchmark::State& state) {
  if (!has_avx512_fma()) {
    state.SkipWithError("this CPU has no AVX-512");
    return;
  }
  float start = 1.0f;
  for (auto _ : state) {
    benchmark::DoNotOptimize(start);  // opaque input: the loop runs every iteration
    float result = fp32_fma_loop(start, kPeakRepeats);
    benchmark::DoNotOptimize(result);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(fp32_fma_flops(kPeakRepeats) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void bm_bf16_dot_peak(benchmark::State& state) {
  if (!has_avx512_bf16()) {
    state.SkipWithError("this CPU has no AVX512-BF16");
    return;
  }
  float start = 1.0f;
  for (auto _ : state) {
    benchmark::DoNotOptimize(start);  // opaque input: the loop runs every iteration
    float result = bf16_dot_loop(start, kPeakRepeats);
    benchmark::DoNotOptimize(result);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(bf16_dot_flops(kPeakRepeats) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// Console output as usual, plus the per-benchmark medians (or single results) kept for the
// summary. Counters reach a reporter already divided by time, so GFLOP/s is final here. Rates
// use the benchmark thread's CPU time, not wall time: the machine is shared, and CPU time leaves
// out the slices in which the OS ran someone else's process on this core (wall time is shown
// beside it).
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  SummaryReporter() : ConsoleReporter(OO_Tabular) {}  // plain text: it is pasted into docs

  struct Result {
    double gflops = 0;  // on the benchmark thread's CPU time
    double cpu_milliseconds = 0;
    double wall_milliseconds = 0;
  };

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
      if (!median && !single) continue;
      Result r;
      auto it = run.counters.find("GFLOP/s");
      if (it != run.counters.end()) r.gflops = it->second.value;
      double to_ms = benchmark::GetTimeUnitMultiplier(benchmark::kMillisecond) /
                     benchmark::GetTimeUnitMultiplier(run.time_unit);
      r.cpu_milliseconds = run.GetAdjustedCPUTime() * to_ms;
      r.wall_milliseconds = run.GetAdjustedRealTime() * to_ms;
      results_[run.run_name.function_name] = r;
    }
  }
  const Result* find(const std::string& name) const {
    auto it = results_.find(name);
    return it == results_.end() ? nullptr : &it->second;
  }

 private:
  std::map<std::string, Result> results_;
};

std::string percent(double part, double whole) {
  return whole > 0 ? fmt::format("{:.1f}%", 100.0 * part / whole) : "n/a";
}

void print_summary(const SummaryReporter& reporter, const std::vector<GemmCase>& cases,
                   int threads) {
  const auto* fp32_peak = reporter.find(kFp32PeakName);
  const auto* bf16_peak = reporter.find(kBf16PeakName);
  double fp32_peak_gflops = fp32_peak ? fp32_peak->gflops : 0;
  double bf16_peak_gflops = bf16_peak ? bf16_peak->gflops : 0;
  double best_bf16 = 0;
  std::string best_bf16_name = "n/a";
  for (const GemmCase& c : cases) {
    const auto* r = reporter.find(c.name());
    if (c.input == DType::kBF16 && r != nullptr && r->gflops > best_bf16) {
      best_bf16 = r->gflops;
      best_bf16_name = c.name();
    }
  }

  fmt::print("\n== GEMM summary (medians; threads per rank: {}) ==\n", threads);
  fmt::print("fp32 AVX-512 FMA peak : {:8.1f} GFLOP/s\n", fp32_peak_gflops);
  fmt::print("bf16 VDPBF16PS peak   : {:8.1f} GFLOP/s\n", bf16_peak_gflops);
  fmt::print("best bf16 GEMM        : {:8.1f} GFLOP/s ({})\n", best_bf16, best_bf16_name);
  fmt::print("implementations       : f32 {}, bf16 {}\n\n",
             matmul_implementation(1024, 768, 768, DType::kF32, DType::kF32),
             matmul_implementation(1024, 768, 768, DType::kBF16, DType::kBF16));
  fmt::print(
      "| case | CPU ms | wall ms | GFLOP/s | of fp32 peak | of bf16 peak | of best bf16 |\n");
  fmt::print("|---|---:|---:|---:|---:|---:|---:|\n");
  for (const GemmCase& c : cases) {
    const auto* r = reporter.find(c.name());
    if (r == nullptr) continue;
    fmt::print("| {} | {:.2f} | {:.2f} | {:.1f} | {} | {} | {} |\n", c.name(), r->cpu_milliseconds,
               r->wall_milliseconds, r->gflops, percent(r->gflops, fp32_peak_gflops),
               c.input == DType::kBF16 ? percent(r->gflops, bf16_peak_gflops) : "",
               c.input == DType::kBF16 ? percent(r->gflops, best_bf16) : "");
  }

  for (DType dtype : {DType::kF32, DType::kBF16}) {
    GemmCase c{1024, 768, 768, dtype, dtype};
    const auto* first = reporter.find("first_call/" + c.name());
    const auto* steady = reporter.find(c.name());
    const auto* prepare = reporter.find("prepare/" + c.name());
    if (first != nullptr && steady != nullptr && prepare != nullptr) {
      fmt::print(
          "\n{}: first call (creates the primitive) {:.3f} ms, steady-state call {:.3f} ms, "
          "preparing alone {:.3f} ms (CPU time)",
          c.name(), first->cpu_milliseconds, steady->cpu_milliseconds, prepare->cpu_milliseconds);
    }
  }
  fmt::print("\n\nTargets (single thread):\n");
  const auto* bf16_mlp =
      reporter.find(GemmCase{4096, 768, 3072, DType::kBF16, DType::kBF16}.name());
  const auto* f32_mlp = reporter.find(GemmCase{4096, 768, 3072, DType::kF32, DType::kF32}.name());
  const auto* f32_square =
      reporter.find(GemmCase{2048, 2048, 2048, DType::kF32, DType::kF32}.name());
  auto verdict = [](bool met) { return met ? "MET" : "MISSED"; };
  if (bf16_mlp != nullptr && f32_mlp != nullptr) {
    double ratio = bf16_mlp->gflops / f32_mlp->gflops;
    fmt::print("  bf16 / f32 at M=4096 K=768 N=3072     : {:.2f}x (target >= 6x)    {}\n", ratio,
               verdict(ratio >= 6.0));
  }
  if (bf16_mlp != nullptr && best_bf16 > 0) {
    double share = bf16_mlp->gflops / best_bf16;
    fmt::print("  bf16 M=4096 K=768 N=3072 / best bf16  : {:.1f}% (target >= 50%)   {}\n",
               100 * share, verdict(share >= 0.5));
  }
  if (f32_square != nullptr && fp32_peak_gflops > 0) {
    double share = f32_square->gflops / fp32_peak_gflops;
    fmt::print("  f32 2048^3 / fp32 FMA peak            : {:.1f}% (target >= 60%)   {}\n",
               100 * share, verdict(share >= 0.6));
  }
}

double thread_cpu_milliseconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
}

// The first matmul of the process also pays oneDNN's one-time setup (CPU detection, engine,
// stream); timed once, before any benchmark, on the first-call shape.
double process_first_call_milliseconds() {
  GemmCase c{1024, 768, 768, DType::kF32, DType::kF32};
  GemmOperands operands(c);
  double start = thread_cpu_milliseconds();
  matmul(operands.out_tensor, operands.a_tensor, operands.b_tensor);
  return thread_cpu_milliseconds() - start;
}

// Removes --lattice_threads=N from argv (Google Benchmark rejects flags it does not know).
int take_threads_flag(int& argc, char** argv) {
  int threads = 1;
  constexpr std::string_view kFlag = "--lattice_threads=";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.substr(0, kFlag.size()) == kFlag) {
      threads = std::max(1, std::atoi(argv[i] + kFlag.size()));
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return threads;
}

}  // namespace
}  // namespace lattice

int main(int argc, char** argv) {
  using namespace lattice;
  int threads = take_threads_flag(argc, argv);
  set_thread_budget(threads);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  benchmark::AddCustomContext("lattice_threads", std::to_string(threads));
  double process_first_call = process_first_call_milliseconds();
  const char* max_isa = std::getenv("DNNL_MAX_CPU_ISA");
  benchmark::AddCustomContext("DNNL_MAX_CPU_ISA", max_isa ? max_isa : "(unset)");
  benchmark::RegisterBenchmark(kFp32PeakName, bm_fp32_fma_peak)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(kBf16PeakName, bm_bf16_dot_peak)->Unit(benchmark::kMillisecond);
  std::vector<GemmCase> cases = gemm_cases();
  for (const GemmCase& c : cases) {
    benchmark::RegisterBenchmark(c.name().c_str(), bm_gemm, c)->Unit(benchmark::kMillisecond);
  }
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    GemmCase c{1024, 768, 768, dtype, dtype};
    benchmark::RegisterBenchmark(("first_call/" + c.name()).c_str(), bm_first_call, c)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("prepare/" + c.name()).c_str(), bm_prepare, c)
        ->Unit(benchmark::kMillisecond);
  }

  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  print_summary(reporter, cases, threads);
  fmt::print("\nfirst matmul of the process ({}, incl. oneDNN setup): {:.3f} ms (CPU time)\n",
             GemmCase{1024, 768, 768, DType::kF32, DType::kF32}.name(), process_first_call);
  benchmark::Shutdown();
  return 0;
}
