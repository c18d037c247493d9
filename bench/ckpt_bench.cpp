// Checkpoint save and load of gpt2-124m (fp32 master weights and both AdamW moments, ~1.5 GB)
// against the disk's sequential write bandwidth measured in the same run (the baseline: the
// same number of bytes written with write(2) in 8 MiB blocks and fsynced). Reported as MB/s
// and as a fraction of the baseline; the asynchronous save reports the stall training sees
// (the snapshot into memory) as a fraction of the synchronous save time (target <= 0.10), for
// the steady state (buffers reused) and the first save (first_stall_s).
// The multi-rank path of `lattice train --ckpt-async` (CollectiveAsyncSaver, as
// TrainerCheckpointer uses it) is measured on 2 in-process ranks that each own half of the
// flat store (a dp-2 ZeRO-1 layout: each writes the master weights and moments of its range):
// the collective synchronous save, and the asynchronous save's stall (the slower rank's
// snapshot plus the staging collective) as a fraction of it.
// Wall time (UseRealTime): the cost is I/O, not CPU.
//
//   build-*/bench/ckpt_bench [--benchmark_filter=...]
//   LATTICE_CKPT_BENCH_MODEL=gpt2-tiny build-*/bench/ckpt_bench   (a quick run)
//   LATTICE_CKPT_BENCH_DIR=/some/disk  (where the files go; default: the temp directory)
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "ckpt/async_saver.h"
#include "ckpt/checkpoint.h"
#include "ckpt/collective_async_saver.h"
#include "ckpt/collective_save.h"
#include "ckpt/flat_range.h"
#include "comm/thread_world.h"
#include "parallel/zero_shards.h"

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

constexpr int kRanks = 2;  // the multi-rank benchmarks' in-process ranks

double g_disk_mb_per_s = 0;                 // baseline of this run
double g_sync_save_seconds = 0;             // for the async stall ratio
double g_collective_sync_save_seconds = 0;  // the same for the 2-rank saves
double g_parallel_disk_mb_per_s = 0;        // their baseline: kRanks writers at once

void report(benchmark::State& state, double seconds_per_iteration) {
  const double mb_per_s = double(bench().bytes) / 1e6 / seconds_per_iteration;
  state.counters["MB/s"] = mb_per_s;
  state.counters["GB"] = double(bench().bytes) / 1e9;
  if (g_disk_mb_per_s > 0) state.counters["disk_frac"] = mb_per_s / g_disk_mb_per_s;
}

// write(2) in 8 MiB blocks, then fsync: false on any failure.
bool write_and_fsync(const fs::path& path, uint64_t bytes) {
  std::vector<char> block(8 << 20, 1);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = true;
  for (uint64_t left = bytes; left > 0 && ok;) {
    size_t n = size_t(std::min<uint64_t>(left, block.size()));
    ok = ::write(fd, block.data(), n) == ssize_t(n);
    left -= n;
  }
  ok = ::fsync(fd) == 0 && ok;
  ::close(fd);
  return ok;
}

void BM_DiskSequentialWriteBaseline(benchmark::State& state) {
  const fs::path path = bench().root / "baseline.bin";
  double total = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    if (!write_and_fsync(path, bench().bytes)) state.SkipWithError("cannot write the baseline");
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  fs::remove(path);
  g_disk_mb_per_s = double(bench().bytes) / 1e6 / (total / double(state.iterations()));
  report(state, total / double(state.iterations()));
}

// The same bytes written by kRanks threads at once, each its share into its own file (what the
// 2-rank saves below do): their baseline (parallel streams may beat one).
void BM_DiskParallelWriteBaseline(benchmark::State& state) {
  double total = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> writers;
    bool ok[kRanks] = {};
    for (int r = 0; r < kRanks; ++r) {
      writers.emplace_back([r, &ok] {
        const fs::path path = bench().root / ("baseline_" + std::to_string(r) + ".bin");
        ok[r] = write_and_fsync(path, bench().bytes / kRanks);
      });
    }
    for (std::thread& t : writers) t.join();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (int r = 0; r < kRanks; ++r) {
      if (!ok[r]) state.SkipWithError("cannot write the baseline");
      fs::remove(bench().root / ("baseline_" + std::to_string(r) + ".bin"));
    }
  }
  g_parallel_disk_mb_per_s = double(bench().bytes) / 1e6 / (total / double(state.iterations()));
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

// What dp rank `rank` of a ZeRO-1 layout over kRanks writes: master weights and moments of its
// range of the flat store (the moments here are views of the whole-store optimizer's).
std::vector<OwnedShard> zero_range_shards(int rank) {
  BenchState& b = bench();
  const int64_t total = b.model->registry().total_elements();
  const FlatRange range = zero_shard(total, kRanks, rank);
  auto slice = [&](Tensor& flat) {
    return flat.view(Shape{flat.numel()}).slice_rows(range.begin, range.end);
  };
  return flat_range_shards(b.model->registry(), b.model->parameters().master(),
                           slice(b.optimizer->m()), slice(b.optimizer->v()), range.begin,
                           range.end);
}

void BM_CollectiveSyncSave(benchmark::State& state) {
  BenchState& b = bench();
  const fs::path root = b.root / "collective_sync";
  TrainingState ts;
  double total = 0;
  for (auto _ : state) {
    double seconds = 0;
    run_ranks(kRanks, [&](Communicator& world) {
      const std::vector<OwnedShard> shards = zero_range_shards(world.rank());
      world.barrier();
      auto start = std::chrono::steady_clock::now();
      save_sharded_checkpoint(CheckpointRoot(root), training_manifest(b.config, *b.model, ts),
                              shards, world, {.keep_last = 1});
      if (world.rank() == 0) {  // the commit is the last collective: every rank is done
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
    });
    total += seconds;
    ++ts.step;
  }
  g_collective_sync_save_seconds = total / double(state.iterations());
  report(state, g_collective_sync_save_seconds);
  if (g_parallel_disk_mb_per_s > 0) {
    state.counters["parallel_disk_frac"] =
        double(bench().bytes) / 1e6 / g_collective_sync_save_seconds / g_parallel_disk_mb_per_s;
  }
  std::error_code ec;
  fs::remove_all(root, ec);
}

// The stall of `lattice train --ckpt-async` per save on 2 ranks: save() on every rank (the
// staging collective and the snapshot), the slower rank's time; the write and commit are waited
// for afterwards. Snapshot buffers reserved first, as the trainer does at startup.
void BM_CollectiveAsyncSaveStall(benchmark::State& state) {
  BenchState& b = bench();
  const fs::path root = b.root / "collective_async";
  TrainingState ts;
  double total = 0;
  for (auto _ : state) {
    double stall[kRanks] = {};  // each in-process rank writes its own slot
    run_ranks(kRanks, [&](Communicator& world) {
      const std::vector<OwnedShard> shards = zero_range_shards(world.rank());
      CollectiveAsyncSaver saver(root, world, {.keep_last = 1});
      saver.reserve(shards);
      world.barrier();
      auto start = std::chrono::steady_clock::now();
      saver.save(training_manifest(b.config, *b.model, ts), shards);
      stall[world.rank()] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      saver.wait();
    });
    const double slowest = *std::max_element(stall, stall + kRanks);
    state.SetIterationTime(slowest);
    total += slowest;
    ++ts.step;
  }
  const double per_save = total / double(state.iterations());
  state.counters["stall_s"] = per_save;
  if (g_collective_sync_save_seconds > 0) {
    state.counters["stall_frac_of_sync"] = per_save / g_collective_sync_save_seconds;
  }
  std::error_code ec;
  fs::remove_all(root, ec);
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
BENCHMARK(BM_DiskParallelWriteBaseline)
    ->Iterations(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CollectiveSyncSave)->Iterations(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CollectiveAsyncSaveStall)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace lattice

BENCHMARK_MAIN();
