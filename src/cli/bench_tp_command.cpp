// `lattice bench tp`: the cost of tensor parallelism in a full training step.
//
//   lattice bench tp --preset gpt2-124m --batch 4 --seq 256 --steps 5 --warmup 2 --tp 1,2
//       [--precision fp32|bf16] [--sp both|on|off]
//
// For each layout (tp = 1 once; every other tp without and/or with sequence parallelism) it runs
// tp in-process ranks (threads transport), each on its own thread budget (1 by default), and
// times the Trainer's training steps (one micro-batch) on the random tokens of `lattice bench
// train` (train/train_benchmark.h), so that the tp = 1 losses of both start from the same
// batch. Per step, a rank's time in tensor-parallel collectives is read from its model's
// TensorParallel::stats(); the table gives medians over the timed steps of the step time and of
// the communication fraction, both max over ranks (the step ends with its slowest rank), the
// collectives and bytes of one step, and the speed-up over tp = 1 measured in the same run.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
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
#include "train/train_benchmark.h"
#include "train/trainer.h"

namespace lattice::cli {
namespace {

struct BenchTpArgs {
  StepBenchOptions step{.preset = "gpt2-124m", .batch = 4, .seq = 256};
  std::vector<int> tp{1, 2};
  std::string sp = "both";  // sequence parallelism for tp > 1: off, on or both
};

struct Layout {
  int tp = 1;
  bool sp = false;
};

// One rank's timed steps.
struct RankSteps {
  std::vector<double> step_s;
  std::vector<double> cpu_s;
  std::vector<double> comm_s;
  std::vector<int64_t> calls;
  std::vector<int64_t> bytes;
  std::vector<double> bus_bytes;
  std::vector<double> losses;  // every step, warm-up included
};

struct LayoutResult {
  Layout layout;
  std::vector<double> step_ms;        // per timed step, max over ranks
  std::vector<double> comm_fraction;  // per timed step, max over ranks of comm / step
  std::vector<double> comm_ms;        // per timed step, max over ranks
  std::vector<double> cpu_ms;         // per timed step, max over ranks
  int64_t calls_per_step = 0;
  int64_t bytes_per_step = 0;
  double bus_bytes_per_step = 0;
  double first_loss = 0, last_loss = 0;
};

// tp ascending, so that tp = 1 (the baseline of the speed-up) runs first.
std::vector<Layout> layouts(const BenchTpArgs& args) {
  std::vector<int> sizes = args.tp;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::vector<Layout> out;
  for (int tp : sizes) {
    if (tp == 1) {  // a group of one has nothing to split: sequence parallelism does not apply
      out.push_back({1, false});
      continue;
    }
    if (args.sp != "on") out.push_back({tp, false});
    if (args.sp != "off") out.push_back({tp, true});
  }
  return out;
}

RankSteps run_rank(const BenchTpArgs& args, const ModelConfig& model_config, bool sp,
                   Communicator& comm) {
  TrainBenchmarkConfig bench{.model = model_config,
                             .batch = args.step.batch,
                             .seq = args.step.seq,
                             .warmup_steps = args.step.warmup,
                             .steps = args.step.steps,
                             .precision = parse_precision(args.step.precision),
                             .threads = args.step.threads,
                             .seed = args.step.seed,
                             .lr = args.step.lr};
  Arena arena(fmt::format("bench-tp-rank{}", comm.rank()));
  Trainer trainer(benchmark_train_config(bench), arena,
                  {.threads = args.step.threads, .tp = &comm, .sequence_parallel = sp},
                  {.train = random_token_file(args.step.batch, args.step.seq,
                                              model_config.vocab_size, args.step.seed),
                   .val = {}});
  TensorParallel& tp = trainer.model().tensor_parallel();

  RankSteps out;
  for (int step = 0; step < args.step.warmup + args.step.steps; ++step) {
    comm.barrier();  // untimed: every rank starts the step together
    tp.reset_stats();
    const double cpu_start = thread_cpu_seconds();
    const StepMetrics m = trainer.train_step();
    const double cpu_seconds = thread_cpu_seconds() - cpu_start;
    if (!std::isfinite(m.loss)) {
      LATTICE_THROW(ValueError, "bench tp: step {} of tp {} rank {} has loss {}", step, comm.size(),
                    comm.rank(), m.loss);
    }
    out.losses.push_back(m.loss);
    if (step < args.step.warmup) continue;
    out.step_s.push_back(m.ms / 1e3);
    out.cpu_s.push_back(cpu_seconds);
    out.comm_s.push_back(tp.stats().seconds);
    out.calls.push_back(tp.stats().calls);
    out.bytes.push_back(tp.stats().bytes);
    out.bus_bytes.push_back(tp.stats().bus_bytes);
  }
  return out;
}

LayoutResult run_layout(const BenchTpArgs& args, const ModelConfig& model_config, Layout layout) {
  std::vector<RankSteps> ranks(size_t(layout.tp));
  ThreadWorldOptions world;
  // A rank may wait a whole step (seconds, more on a loaded machine) at the next barrier; this
  // is a benchmark, not a lost peer.
  world.config.timeout = std::chrono::minutes(5);
  run_ranks(
      layout.tp,
      [&](Communicator& comm) {
        ranks[size_t(comm.rank())] = run_rank(args, model_config, layout.sp, comm);
      },
      world);

  LayoutResult result;
  result.layout = layout;
  const RankSteps& lead = ranks.front();
  for (size_t s = 0; s < lead.step_s.size(); ++s) {
    double step = 0, comm = 0, fraction = 0, cpu = 0;
    for (const RankSteps& r : ranks) {
      step = std::max(step, r.step_s[s]);
      cpu = std::max(cpu, r.cpu_s[s]);
      comm = std::max(comm, r.comm_s[s]);
      fraction = std::max(fraction, r.comm_s[s] / r.step_s[s]);
      LATTICE_CHECK(r.calls[s] == lead.calls[s] && r.bytes[s] == lead.bytes[s],
                    "bench tp: ranks made different collectives in step {}", s);
    }
    result.step_ms.push_back(1e3 * step);
    result.comm_ms.push_back(1e3 * comm);
    result.cpu_ms.push_back(1e3 * cpu);
    result.comm_fraction.push_back(fraction);
  }
  result.calls_per_step = lead.calls.back();
  result.bytes_per_step = lead.bytes.back();
  result.bus_bytes_per_step = lead.bus_bytes.back();
  result.first_loss = lead.losses.front();
  result.last_loss = lead.losses.back();
  return result;
}

void check_args(const BenchTpArgs& args, const ModelConfig& model_config) {
  if (args.step.seq > model_config.seq_len) {
    LATTICE_THROW(ConfigError,  // input refused: exit 3
                  "bench tp: seq {} is longer than the model's context {} ---> HINT: pass a "
                  "smaller --seq",
                  args.step.seq, model_config.seq_len);
  }
  for (int tp : args.tp) {
    if (tp * args.step.threads > available_cores()) {
      LATTICE_THROW(ConfigError,
                    "bench tp: --tp {} ranks x {} thread(s) need {} cores but {} are available "
                    "---> HINT: ranks x threads must not exceed the cores (an oversubscribed "
                    "run measures the scheduler); lower --tp or --threads",
                    tp, args.step.threads, tp * args.step.threads, available_cores());
    }
  }
}

void run_bench_tp(const BenchTpArgs& args) {
  const ModelConfig model_config = model_preset(args.step.preset);
  check_args(args, model_config);
  const int64_t tokens_per_step = args.step.batch * args.step.seq;
  fmt::print(
      "# lattice bench tp: {} B={} T={} ({} tokens/step), {}, {} warm-up + {} timed steps, {} "
      "thread(s) per rank, threads transport\n",
      args.step.preset, args.step.batch, args.step.seq, tokens_per_step, args.step.precision,
      args.step.warmup, args.step.steps, args.step.threads);
  fmt::print("# machine at start: {}\n", machine_state());
  fmt::print(
      "# ms/step and TP comm: medians over the timed steps of the max over ranks; comm is wall "
      "time inside TensorParallel's collectives (waiting for the peer included)\n"
      "# CPU ms: the rank thread's CPU time in the step (max over ranks); far below ms/step when "
      "other processes take the cores\n"
      "# MB/step: full buffers of the step's collectives (nccl-tests size); bus MB/step: what "
      "each rank sends on a ring (all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n)\n");
  fmt::print(
      "# {:>3} {:>3} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>10} {:>9} {:>9} {:>16}\n",
      "tp", "sp", "ms/step", "min ms", "max ms", "CPU ms", "tok/s", "speed-up", "TP comm",
      "comm ms", "calls/step", "MB/step", "bus MB", "loss first->last");
  double baseline_ms = 0;  // tp = 1 of this run
  for (const Layout& layout : layouts(args)) {
    const LayoutResult r = run_layout(args, model_config, layout);
    const double ms = median(r.step_ms);
    if (layout.tp == 1) baseline_ms = ms;
    const std::string speedup = baseline_ms > 0 ? fmt::format("{:.2f}x", baseline_ms / ms) : "-";
    const std::string sp = layout.tp == 1 ? "-" : layout.sp ? "on" : "off";
    fmt::print(
        "  {:>3} {:>3} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>8.1f} {:>8} {:>7.1f}% {:>9.1f} "
        "{:>10} "
        "{:>9.1f} {:>9.1f} {:>7.4f}->{:.4f}\n",
        layout.tp, sp, ms, *std::min_element(r.step_ms.begin(), r.step_ms.end()),
        *std::max_element(r.step_ms.begin(), r.step_ms.end()), median(r.cpu_ms),
        double(tokens_per_step) / (ms / 1e3), speedup, 100 * median(r.comm_fraction),
        median(r.comm_ms), r.calls_per_step, double(r.bytes_per_step) / 1e6,
        r.bus_bytes_per_step / 1e6, r.first_loss, r.last_loss);
    std::fflush(stdout);  // rows arrive a minute apart: show each as it is measured
  }
  fmt::print("# machine at end: {}\n", machine_state());
}

}  // namespace

void register_bench_tp_command(CLI::App& app) {
  CLI::App* bench = bench_parent(app);
  auto args = std::make_shared<BenchTpArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "tp", "Training steps per tensor-parallel layout: ms/step, fraction in TP collectives");
  add_step_bench_options(*cmd, args->step, "model preset (random init)");
  cmd->add_option("--tp", args->tp, "tensor-parallel sizes, e.g. 1,2 (1 is the baseline)")
      ->delimiter(',')
      ->check(positive_number());
  cmd->add_option("--sp", args->sp, "sequence parallelism for tp > 1: off, on or both")
      ->check(CLI::IsMember({"off", "on", "both"}));
  cmd->callback([args] { run_bench_tp(*args); });
}

}  // namespace lattice::cli
