// Checkpoint save and load of gpt2-124m (fp32 master weights and both AdamW moments, ~1.5 GB)
// against the disk's sequential write bandwidth measured in the same run (the baseline: the
// same number of bytes written with write(2) in 8 MiB blocks and fsynced). Reported as MB/s
// and as a fraction of the baseline; the asynchronous save reports the stall training sees
// (the snapshot into memory) as a fraction of the synchronous save time (target <= 0.10), for
// the steady state (buffers reused) and the first save (first_stall_s).
// Wall time (UseRealTime): the cost is I/O, not CPU.
//
//   build-*/bench/ckpt_bench [--benchmark_filter=...]
//   LATTICE_CKPT_BENCH_MODEL=gpt2-tiny build-*/bench/ckpt_bench   (a quick run)
//   LATTICE_CKPT_BENCH_DIR=/some/disk  (where the files go; default: the temp directory)
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "ckpt/async_saver.h"
#include "ckpt/checkpoint.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

fs::path bench_root() {
  const char* dir = std::getenv("LATTICE_CKPT_BENCH_DIR");
  return fs::path(dir != nullptr ? dir : fs::temp_directory_path().string()) /
         ("lattice_ckpt_bench_" + std::to_string(::getpid()));
}

// The model and optimizer of the benchmark, built once per process; files removed at exit.
struct BenchState {
  Arena arena{"bench"};
  TrainConfig config;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<AdamW> optimizer;
  fs::path root = bench_root();
  uint64_t bytes = 0;  // tensor bytes in one checkpoint

  BenchState() {
    const char* name = std::getenv("LATTICE_CKPT_BENCH_MODEL");
    config.model = model_preset(name != nullptr ? name : "gpt2-124m");
    model = std::make_unique<Transformer>(config.model, arena, DType::kF32);
    model->initialize(1);
    optimizer = std::make_unique<AdamW>(model->parameters(), arena, config.adam);
    optimizer->m().zero_();
    optimizer->v().zero_();
    bytes = 3 * uint64_t(model->parameters().master().nbytes());
    fs::create_directories(root);
  }
  ~BenchState() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};
BenchState& bench() {
  static BenchState s;
  return s;
}

double g_disk_mb_per_s = 0;      // baseline of this run
double g_sync_save_seconds = 0;  // for the async stall ratio

void report(benchmark::State& state, double seconds_per_iteration) {
  const double mb_per_s = double(bench().bytes) / 1e6 / seconds_per_iteration;
  state.counters["MB/s"] = mb_per_s;
  state.counters["GB"] = double(bench().bytes) / 1e9;
  if (g_disk_mb_per_s > 0) state.counters["disk_frac"] = mb_per_s / g_disk_mb_per_s;
}

void BM_DiskSequentialWriteBaseline(benchmark::State& state) {
  const fs::path path = bench().root / "baseline.bin";
  std::vector<char> block(8 << 20, 1);
  double total = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) state.SkipWithError("cannot create the baseline file");
    for (uint64_t left = bench().bytes; left > 0;) {
      size_t n = size_t(std::min<uint64_t>(left, block.size()));
      if (::write(fd, block.data(), n) != ssize_t(n)) state.SkipWithError("short write");
      left -= n;
    }
    ::fsync(fd);
    ::close(fd);
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  fs::remove(path);
  g_disk_mb_per_s = double(bench().bytes) / 1e6 / (total / double(state.iterations()));
  report(state, total / double(state.iterations()));
}

void BM_SyncSave(benchmark::State& state) {
  BenchState& b = bench();
  TrainingState ts;
  double total = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    save_training_checkpoint(b.root, b.config, *b.model, *b.optimizer, ts,
                             {.keep_last = 1, .hook = {}});
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++ts.step;
  }
  g_sync_save_seconds = total / double(state.iterations());
  report(state, g_sync_save_seconds);
}

void BM_LoadVerified(benchmark::State& state) {
  BenchState& b = bench();
  TrainingState ts;
  ts.step = 1000000;
  fs::path dir = save_training_checkpoint(b.root, b.config, *b.model, *b.optimizer, ts,
                                          {.keep_last = 1, .hook = {}});
  double total = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(load_training_checkpoint(dir, *b.model, *b.optimizer));
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  report(state, total / double(state.iterations()));
}

// The stall: save() returns once the snapshot is in memory; the write overlaps "training"
// (here: nothing) and is waited for outside the timed region.
void BM_AsyncSaveStall(benchmark::State& state) {
  BenchState& b = bench();
  AsyncCheckpointSaver saver(b.root / "async", {.keep_last = 1, .hook = {}});
  TrainingState ts;
  // The first save allocates the snapshot buffers (fresh pages) unless reserve() did it at
  // startup; later saves reuse them.
  if (state.range(0) == 1) saver.reserve(model_optimizer_shards(*b.model, *b.optimizer));
  auto first = std::chrono::steady_clock::now();
  saver.save(training_manifest(b.config, *b.model, ts),
             model_optimizer_shards(*b.model, *b.optimizer));
  state.counters["first_stall_s"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count();
  saver.wait();
  ++ts.step;
  double stall = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    saver.save(training_manifest(b.config, *b.model, ts),
               model_optimizer_shards(*b.model, *b.optimizer));
    stall += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.PauseTiming();
    saver.wait();
    state.ResumeTiming();
    ++ts.step;
  }
  const double per_save = stall / double(state.iterations());
  state.counters["stall_s"] = per_save;
  if (g_sync_save_seconds > 0)
    state.counters["stall_frac_of_sync"] = per_save / g_sync_save_seconds;
}

BENCHMARK(BM_DiskSequentialWriteBaseline)
    ->Iterations(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SyncSave)->Iterations(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoadVerified)->Iterations(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AsyncSaveStall)
    ->ArgName("reserved")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace lattice

BENCHMARK_MAIN();
