// `lattice bench cp`: the cost of context parallelism in a full training step.
//
//   lattice bench cp --preset gpt2-tiny --batch 2 --seq 2048 --steps 5 --warmup 2 --cp 1,2
//       [--precision fp32|bf16] [--threads 1]
//
// For each cp (ascending, cp = 1 the baseline of the same run) it runs cp in-process ranks on
// one mesh (threads transport), each on its own thread budget, and times the Trainer's steps on
// the random tokens of `lattice bench train`. Per step a rank's ring is read from its model's
// ContextParallel::stats(): the time blocked in receives and send waits (the ring traffic the
// tiles did not hide) and the bytes sent. The table gives medians over the timed steps of the
// max over ranks, the exposed share of the step, each rank's activation peak and the speed-up.
// A preset's context shorter than --seq is lengthened (random initialisation either way).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/bench_parent.h"
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "comm/thread_world.h"
#include "core/arena.h"
#include "core/error.h"
#include "core/statistics.h"
#include "core/thread_budget.h"
#include "parallel/device_mesh.h"
#include "train/train_benchmark.h"
#include "train/trainer.h"

namespace lattice::cli {
namespace {

struct BenchCpArgs {
  StepBenchOptions step{.preset = "gpt2-tiny", .batch = 2, .seq = 2048};
  std::vector<int> cp{1, 2};
};

struct RankSteps {
  std::vector<double> step_s, exposed_s, ring_s;
  std::vector<int64_t> bytes;
  std::vector<double> losses;  // every step, warm-up included
  size_t activation_peak = 0;
};

struct CpResult {
  int cp = 1;
  std::vector<double> step_ms, exposed_ms, ring_ms, exposed_share;  // max over ranks, per step
  int64_t bytes_per_step = 0;
  size_t activation_peak = 0;  // max over ranks
  double first_loss = 0, last_loss = 0;
};

RankSteps run_rank(const BenchCpArgs& args, const ModelConfig& model, Communicator& world) {
  const TrainBenchmarkConfig bench{.model = model,
                                   .batch = args.step.batch,
                                   .seq = args.step.seq,
                                   .warmup_steps = args.step.warmup,
                                   .steps = args.step.steps,
                                   .precision = parse_precision(args.step.precision),
                                   .threads = args.step.threads,
                                   .seed = args.step.seed,
                                   .lr = args.step.lr};
  DeviceMesh mesh(world, {.cp = world.size()});
  Arena arena(fmt::format("bench-cp-rank{}", world.rank()));
  Trainer trainer(
      benchmark_train_config(bench), arena,
      {.dp = &mesh.replicas(), .cp = mesh.cp(), .threads = args.step.threads},
      {.train = random_token_file(args.step.batch, args.step.seq, model.vocab_size, args.step.seed),
       .val = {}});
  ContextParallel& ring = trainer.model().context_parallel();
  RankSteps out;
  for (int step = 0; step < args.step.warmup + args.step.steps; ++step) {
    world.barrier();  // untimed: every rank starts the step together
    ring.reset_stats();
    const StepMetrics m = trainer.train_step();
    if (!std::isfinite(m.loss)) {
      LATTICE_THROW(ValueError, "bench cp: step {} of cp {} rank {} has loss {}", step,
                    world.size(), world.rank(), m.loss);
    }
    out.losses.push_back(m.loss);
    if (step < args.step.warmup) continue;
    out.step_s.push_back(m.ms / 1e3);
    out.exposed_s.push_back(ring.stats().exposed_seconds);
    out.ring_s.push_back(ring.stats().seconds);
    out.bytes.push_back(ring.stats().bytes);
  }
  out.activation_peak = arena.stats().peak_by_category[size_t(MemoryCategory::kActivations)];
  return out;
}

CpResult run_cp(const BenchCpArgs& args, const ModelConfig& model, int cp) {
  std::vector<RankSteps> ranks(static_cast<size_t>(cp));
  ThreadWorldOptions world;
  world.config.timeout = std::chrono::minutes(5);  // a benchmark, not a lost peer
  run_ranks(
      cp, [&](Communicator& comm) { ranks[size_t(comm.rank())] = run_rank(args, model, comm); },
      world);
  CpResult result;
  result.cp = cp;
  const RankSteps& lead = ranks.front();
  for (size_t s = 0; s < lead.step_s.size(); ++s) {
    double step = 0, exposed = 0, ring = 0, share = 0;
    for (const RankSteps& r : ranks) {
      step = std::max(step, r.step_s[s]);
      exposed = std::max(exposed, r.exposed_s[s]);
      ring = std::max(ring, r.ring_s[s]);
      share = std::max(share, r.exposed_s[s] / r.step_s[s]);
    }
    result.step_ms.push_back(1e3 * step);
    result.exposed_ms.push_back(1e3 * exposed);
    result.ring_ms.push_back(1e3 * ring);
    result.exposed_share.push_back(share);
  }
  for (const RankSteps& r : ranks) {
    result.activation_peak = std::max(result.activation_peak, r.activation_peak);
  }
  result.bytes_per_step = lead.bytes.back();
  result.first_loss = lead.losses.front();
  result.last_loss = lead.losses.back();
  return result;
}

void run_bench_cp(BenchCpArgs args) {
  ModelConfig model = model_preset(args.step.preset);
  model.seq_len = std::max(model.seq_len, args.step.seq);
  std::sort(args.cp.begin(), args.cp.end());
  args.cp.erase(std::unique(args.cp.begin(), args.cp.end()), args.cp.end());
  for (int cp : args.cp) {
    validate_context_parallel(cp, args.step.seq);
    if (cp * args.step.threads > available_cores()) {
      LATTICE_THROW(ConfigError,
                    "bench cp: --cp {} ranks x {} thread(s) need {} cores but {} are available "
                    "---> HINT: ranks x threads must not exceed the cores (an oversubscribed run "
                    "measures the scheduler); lower --cp or --threads",
                    cp, args.step.threads, cp * args.step.threads, available_cores());
    }
  }
  const int64_t tokens_per_step = args.step.batch * args.step.seq;
  fmt::print(
      "# lattice bench cp: {} B={} T={} ({} tokens/step), {}, {} warm-up + {} timed steps, {} "
      "thread(s) per rank, threads transport\n",
      args.step.preset, args.step.batch, args.step.seq, tokens_per_step, args.step.precision,
      args.step.warmup, args.step.steps, args.step.threads);
  fmt::print("# machine at start: {}\n", machine_state());
  fmt::print(
      "# ms/step, ring ms and exposed: medians over the timed steps of the max over ranks; ring "
      "ms is the wall time inside ring attention (its tiles included), exposed the part blocked "
      "on the ring's transfers; act MiB: each rank's activation peak (arena)\n");
  fmt::print("# {:>3} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9} {:>8} {:>9} {:>16}\n", "cp",
             "ms/step", "min ms", "tok/s", "speed-up", "ring ms", "exposed", "exp. %", "MB/step",
             "act MiB", "loss first->last");
  double baseline_ms = 0;
  for (int cp : args.cp) {
    const CpResult r = run_cp(args, model, cp);
    const double ms = median(r.step_ms);
    if (cp == 1) baseline_ms = ms;
    const std::string speedup = baseline_ms > 0 ? fmt::format("{:.2f}x", baseline_ms / ms) : "-";
    fmt::print(
        "  {:>3} {:>9.1f} {:>9.1f} {:>9.1f} {:>8} {:>9.1f} {:>9.2f} {:>8.1f}% {:>8.2f} {:>9.2f} "
        "{:>7.4f}->{:.4f}\n",
        cp, ms, *std::min_element(r.step_ms.begin(), r.step_ms.end()),
        double(tokens_per_step) / (ms / 1e3), speedup, median(r.ring_ms), median(r.exposed_ms),
        100 * median(r.exposed_share), double(r.bytes_per_step) / 1e6,
        double(r.activation_peak) / 1048576.0, r.first_loss, r.last_loss);
    std::fflush(stdout);
  }
  fmt::print("# machine at end: {}\n", machine_state());
}

}  // namespace

void register_bench_cp_command(CLI::App& app) {
  CLI::App* bench = bench_parent(app);
  auto args = std::make_shared<BenchCpArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "cp", "Training steps per context-parallel size: ms/step, exposed share of ring traffic");
  add_step_bench_options(*cmd, args->step, "model preset (random init; context lengthened)");
  cmd->add_option("--cp", args->cp, "context-parallel sizes, e.g. 1,2 (1 is the baseline)")
      ->delimiter(',')
      ->check(positive_number());
  cmd->callback([args] { run_bench_cp(*args); });
}

}  // namespace lattice::cli
