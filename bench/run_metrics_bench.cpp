// What the per-rank metrics cost (issue: at most 1% of the demo's step): one record of
// RankMetrics::write (JSON built, written, flushed) against one training step of the demo model
// (shakespeare-char, 6 sequences of 64 tokens: one of the demo's two ranks, one thread),
// measured in the same run. BM_RankMetricsWrite reports `share_of_demo_step`, its time over the
// median demo step measured just before it.
//
//   build/bench/run_metrics_bench
#include <benchmark/benchmark.h>

#include <filesystem>
#include <memory>

#include "comm/thread_world.h"
#include "core/statistics.h"
#include "core/thread_budget.h"
#include "core/timer.h"
#include "parallel/device_mesh.h"
#include "run/rank_metrics.h"
#include "train/train_benchmark.h"
#include "train/trainer.h"

namespace lattice {
namespace {

constexpr int64_t kDemoRows = 6;  // the demo's rows per rank (global batch 12 over dp 2)
constexpr int64_t kDemoSeq = 64;

TrainConfig demo_config() {
  TrainBenchmarkConfig bench;
  bench.model = model_preset("shakespeare-char");
  bench.batch = kDemoRows;
  bench.seq = kDemoSeq;
  bench.threads = 1;
  return benchmark_train_config(bench);
}

std::unique_ptr<Trainer> demo_trainer(Arena& arena) {
  const TrainConfig config = demo_config();
  return std::make_unique<Trainer>(
      config, arena, ParallelSetup{.threads = 1},
      TrainingData{.train = random_token_file(kDemoRows, kDemoSeq, config.model.vocab_size, 7),
                   .val = nullptr});
}

// The median of `steps` demo steps after two untimed ones, seconds.
double demo_step_seconds(int steps) {
  set_thread_budget(1);
  Arena arena("demo");
  std::unique_ptr<Trainer> trainer = demo_trainer(arena);
  trainer->train_step();
  trainer->train_step();
  std::vector<double> seconds;
  for (int s = 0; s < steps; ++s) seconds.push_back(trainer->train_step().ms / 1e3);
  return median(seconds);
}

void BM_DemoStep(benchmark::State& state) {
  set_thread_budget(1);
  Arena arena("demo");
  std::unique_ptr<Trainer> trainer = demo_trainer(arena);
  trainer->train_step();
  for (auto _ : state) benchmark::DoNotOptimize(trainer->train_step());
}
BENCHMARK(BM_DemoStep)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RankMetricsWrite(benchmark::State& state) {
  const double step_seconds = demo_step_seconds(20);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "lattice_run_metrics_bench";
  std::filesystem::remove_all(dir);
  double record_seconds = 0;
  // A world of two in-process ranks: rank 0 writes its records with a real dp group's
  // statistics in them, as the demo's rank 0 does.
  run_ranks(2, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {.pp = 1, .dp = 2, .tp = 1});
    std::vector<float> buffer(1 << 16, 1.0f);
    mesh.dp().all_reduce(buffer.data(), int64_t(buffer.size()), DType::kF32, ReduceOp::kSum);
    if (comm.rank() != 0) return;
    Arena arena("bench");
    RankMetrics metrics(dir, mesh, arena, 0);
    StepMetrics m;
    m.ms = 1e3 * step_seconds;
    m.loss = 2.5;
    m.tokens_per_s = double(kDemoRows * kDemoSeq) / step_seconds;
    Stopwatch watch;
    int64_t records = 0;
    for (auto _ : state) {
      ++m.step;
      metrics.write(m, 1e11);
      ++records;
    }
    record_seconds = watch.seconds() / double(std::max<int64_t>(1, records));
  });
  std::filesystem::remove_all(dir);
  state.counters["demo_step_ms"] = 1e3 * step_seconds;
  state.counters["share_of_demo_step"] = record_seconds / step_seconds;
}
BENCHMARK(BM_RankMetricsWrite)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace lattice

BENCHMARK_MAIN();
