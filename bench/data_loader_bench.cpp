// Token loader throughput: global batches of GPT-2-sized windows (B = 8, T =
// 1024) read from a memory-mapped token file of the default corpus size
// (1,115,394 tokens, page cache warm), sequential and shuffled, reported as
// tokens/s and as a fraction of the baseline measured in the same run: widening
// the same number of contiguous uint16 tokens to the int32 inputs and targets
// with no window lookup (the least work any loader must do).
//
//   build-*/bench/data_loader_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/token_loader.h"

namespace lattice {
namespace {

constexpr int64_t kB = 8;
constexpr int64_t kT = 1024;
constexpr int64_t kFileTokens = 1115394;

// A token file written once per process, removed at exit.
struct BenchFile {
  std::filesystem::path path;
  std::shared_ptr<const TokenFile> file;
  BenchFile() {
    path = std::filesystem::temp_directory_path() /
           ("lattice_data_loader_bench_" + std::to_string(::getpid()) + ".bin");
    std::vector<int32_t> tokens(kFileTokens);
    for (int64_t i = 0; i < kFileTokens; ++i) tokens[size_t(i)] = int32_t((i * 31) % 65);
    write_token_file(path, tokens);
    file = std::make_shared<const TokenFile>(path);
  }
  ~BenchFile() { std::filesystem::remove(path); }
};
BenchFile& bench_file() {
  static BenchFile f;
  return f;
}

// Tokens per CPU second of the last baseline run (the baseline is registered first).
double g_baseline_tokens_per_s = 0;

// CPU time of this thread: the machine is shared, so wall time would measure the neighbours.
double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

void BM_WidenBaseline(benchmark::State& state) {
  const uint16_t* tokens = bench_file().file->tokens().data();
  std::vector<int32_t> inputs(size_t(kB * kT)), targets(size_t(kB * kT));
  int64_t batch = 0;
  const int64_t span = kFileTokens - kB * kT - 1;
  double start = thread_seconds();
  for (auto _ : state) {
    const uint16_t* src = tokens + (batch++ * kB * kT) % span;
    for (int64_t i = 0; i < kB * kT; ++i) {
      inputs[size_t(i)] = src[i];
      targets[size_t(i)] = src[i + 1];
    }
    benchmark::DoNotOptimize(inputs.data());
    benchmark::DoNotOptimize(targets.data());
    benchmark::ClobberMemory();
  }
  g_baseline_tokens_per_s = double(state.iterations() * kB * kT) / (thread_seconds() - start);
  state.SetItemsProcessed(state.iterations() * kB * kT);
}

void run_loader(benchmark::State& state, SamplingMode mode) {
  Arena arena("bench", size_t(1) << 20);
  TokenLoader loader(bench_file().file, {mode, 1234, kB, kT});
  TokenBatch batch = make_token_batch(arena, kB, kT);
  double start = thread_seconds();
  for (auto _ : state) {
    loader.next(batch.inputs, batch.targets);
    benchmark::DoNotOptimize(batch.inputs.raw_data());
    benchmark::ClobberMemory();
  }
  double tokens_per_s = double(state.iterations() * kB * kT) / (thread_seconds() - start);
  state.SetItemsProcessed(state.iterations() * kB * kT);
  if (g_baseline_tokens_per_s > 0) {
    state.counters["vs_baseline"] = tokens_per_s / g_baseline_tokens_per_s;
  }
}

void BM_TokenLoaderSequential(benchmark::State& state) {
  run_loader(state, SamplingMode::kSequential);
}
void BM_TokenLoaderShuffled(benchmark::State& state) {
  run_loader(state, SamplingMode::kShuffled);
}

BENCHMARK(BM_WidenBaseline);
BENCHMARK(BM_TokenLoaderSequential);
BENCHMARK(BM_TokenLoaderShuffled);

}  // namespace
}  // namespace lattice

BENCHMARK_MAIN();
