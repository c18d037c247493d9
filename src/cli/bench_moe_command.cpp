// `lattice bench moe`: the cost of expert parallelism in a full training step.
//
//   lattice bench moe --preset mixtral-tiny --batch 8 --seq 256 --dp 2 --ep 1,2 --steps 5
//       [--precision fp32|bf16] [--threads 1]
//
// For each ep (ascending; ep = 1, every rank holding every expert, is the baseline of the same
// run) it runs dp in-process ranks with each layer's experts over ep of them, at the same global
// batch, and times the Trainer's steps on the random tokens of `lattice bench train`. A rank's
// all-to-all time is read from its model's ExpertParallel::stats(). The table gives medians over
// the timed steps of the max over ranks, the all-to-all share of the step, the bytes a rank
// sends, its parameter memory and the speed-up.
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
#include "model/moe_router.h"
#include "parallel/device_mesh.h"
#include "train/train_benchmark.h"
#include "train/trainer.h"

namespace lattice::cli {
namespace {

struct BenchMoeArgs {
  StepBenchOptions step{.preset = "mixtral-tiny", .batch = 8, .seq = 256};
  int dp = 2;
  std::vector<int> ep{1, 2};
};

struct RankSteps {
  std::vector<double> step_s, exchange_s;
  std::vector<int64_t> bytes;
  std::vector<double> losses;
  size_t parameter_peak = 0;
};

RankSteps run_rank(const BenchMoeArgs& args, const ModelConfig& model, int ep,
                   Communicator& world) {
  const TrainBenchmarkConfig bench{.model = model,
                                   .batch = args.step.batch,
                                   .seq = args.step.seq,
                                   .warmup_steps = args.step.warmup,
                                   .steps = args.step.steps,
                                   .precision = parse_precision(args.step.precision),
                                   .threads = args.step.threads,
                                   .seed = args.step.seed,
                                   .lr = args.step.lr};
  DeviceMesh mesh(world, {.dp = world.size(), .ep = ep});
  Arena arena(fmt::format("bench-moe-rank{}", world.rank()));
  Trainer trainer(
      benchmark_train_config(bench), arena,
      {.dp = &mesh.replicas(),
       .ep = mesh.ep(),
       .expert_dp = mesh.ep() != nullptr ? &mesh.expert_replicas() : nullptr,
       .threads = args.step.threads},
      {.train = random_token_file(args.step.batch, args.step.seq, model.vocab_size, args.step.seed),
       .val = {}});
  const ExpertParallel& experts = trainer.model().expert_parallel();
  RankSteps out;
  for (int step = 0; step < args.step.warmup + args.step.steps; ++step) {
    world.barrier();  // untimed: every rank starts the step together
    const ExpertParallelStats before = experts.stats();
    const StepMetrics m = trainer.train_step();
    if (!std::isfinite(m.loss)) {
      LATTICE_THROW(ValueError, "bench moe: step {} of ep {} rank {} has loss {}", step, ep,
                    world.rank(), m.loss);
    }
    out.losses.push_back(m.loss);
    if (step < args.step.warmup) continue;
    out.step_s.push_back(m.ms / 1e3);
    out.exchange_s.push_back(experts.stats().seconds - before.seconds);
    out.bytes.push_back(experts.stats().bytes - before.bytes);
  }
  out.parameter_peak = arena.stats().peak_by_category[size_t(MemoryCategory::kParameters)];
  return out;
}

void run_bench_moe(BenchMoeArgs args) {
  ModelConfig model = model_preset(args.step.preset);
  model.seq_len = std::max(model.seq_len, args.step.seq);
  std::sort(args.ep.begin(), args.ep.end());
  args.ep.erase(std::unique(args.ep.begin(), args.ep.end()), args.ep.end());
  for (int ep : args.ep) validate_moe_layout(model, 1, false, ep, args.dp, 0);
  if (args.dp * args.step.threads > available_cores()) {
    LATTICE_THROW(ConfigError,
                  "bench moe: --dp {} ranks x {} thread(s) need {} cores but {} are available "
                  "---> HINT: ranks x threads must not exceed the cores (an oversubscribed run "
                  "measures the scheduler); lower --dp or --threads",
                  args.dp, args.step.threads, args.dp * args.step.threads, available_cores());
  }
  if (args.step.batch % args.dp != 0) {
    LATTICE_THROW(ConfigError, "bench moe: --batch {} does not split over --dp {}", args.step.batch,
                  args.dp);
  }
  fmt::print(
      "# lattice bench moe: {} ({} experts, top {}) B={} T={} over dp {}, {}, {} warm-up + {} "
      "timed steps, {} thread(s) per rank, threads transport\n",
      args.step.preset, model.n_experts, model.experts_per_token, args.step.batch, args.step.seq,
      args.dp, args.step.precision, args.step.warmup, args.step.steps, args.step.threads);
  fmt::print("# machine at start: {}\n", machine_state());
  fmt::print(
      "# ms/step and a2a ms: medians over the timed steps of the max over ranks; a2a: the wall "
      "time in the experts' all-to-alls (dispatch, combine, and both backward); params MiB: a "
      "rank's parameter peak\n");
  fmt::print("# {:>3} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8} {:>9} {:>10} {:>16}\n", "ep", "ms/step",
             "min ms", "tok/s", "speed-up", "a2a ms", "a2a %", "MB/step", "params MiB",
             "loss first->last");
  double baseline_ms = 0;
  for (int ep : args.ep) {
    std::vector<RankSteps> ranks(static_cast<size_t>(args.dp));
    ThreadWorldOptions world;
    world.config.timeout = std::chrono::minutes(5);  // a benchmark, not a lost peer
    run_ranks(
        args.dp,
        [&](Communicator& comm) { ranks[size_t(comm.rank())] = run_rank(args, model, ep, comm); },
        world);
    std::vector<double> step_ms, exchange_ms, share;
    for (size_t s = 0; s < ranks.front().step_s.size(); ++s) {
      double step = 0, exchange = 0, part = 0;
      for (const RankSteps& r : ranks) {
        step = std::max(step, r.step_s[s]);
        exchange = std::max(exchange, r.exchange_s[s]);
        part = std::max(part, r.exchange_s[s] / r.step_s[s]);
      }
      step_ms.push_back(1e3 * step);
      exchange_ms.push_back(1e3 * exchange);
      share.push_back(part);
    }
    size_t parameters = 0;
    for (const RankSteps& r : ranks) parameters = std::max(parameters, r.parameter_peak);
    const double ms = median(step_ms);
    if (ep == 1) baseline_ms = ms;
    const std::string speedup = baseline_ms > 0 ? fmt::format("{:.2f}x", baseline_ms / ms) : "-";
    const RankSteps& lead = ranks.front();
    fmt::print(
        "  {:>3} {:>9.1f} {:>9.1f} {:>9.1f} {:>8} {:>9.2f} {:>7.1f}% {:>9.2f} {:>10.3f} "
        "{:>7.4f}->{:.4f}\n",
        ep, ms, *std::min_element(step_ms.begin(), step_ms.end()),
        double(args.step.batch * args.step.seq) / (ms / 1e3), speedup, median(exchange_ms),
        100 * median(share), double(lead.bytes.back()) / 1e6, double(parameters) / 1048576.0,
        lead.losses.front(), lead.losses.back());
    std::fflush(stdout);
  }
  fmt::print("# machine at end: {}\n", machine_state());
}

}  // namespace

void register_bench_moe_command(CLI::App& app) {
  CLI::App* bench = bench_parent(app);
  auto args = std::make_shared<BenchMoeArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "moe", "Training steps per expert-parallel size: ms/step, the all-to-all share");
  add_step_bench_options(*cmd, args->step, "a mixture-of-experts preset (random init)",
                         "sequences per step, over all dp ranks");
  cmd->add_option("--dp", args->dp, "data-parallel ranks the experts spread over")
      ->check(positive_number());
  cmd->add_option("--ep", args->ep, "expert-parallel sizes, e.g. 1,2 (1 is the baseline)")
      ->delimiter(',')
      ->check(positive_number());
  cmd->callback([args] { run_bench_moe(*args); });
}

}  // namespace lattice::cli
