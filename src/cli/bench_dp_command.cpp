// `lattice bench dp`: what data parallelism and each ZeRO stage cost in a training step.
//
//   lattice bench dp configs/shakespeare-char.toml --dp 2 --zero 0,1,2,3 --steps 100
//       --warmup 20 --repeat 2 [--set parallel.bucket_mb=0.25]
//
// Trains the config's model on its data with the same global batch in every layout: dp = 1
// (the baseline) and dp = N at each ZeRO stage, one thread per rank (threads transport). The
// layouts run one after another, `--repeat` times in turn, so that a change in the machine's load
// hits them alike; each row gives the median over all its timed steps (rank 0's step time), the
// throughput ratio to dp = 1 of the same run, the share of the data-parallel communication hidden
// behind forward/backward as the rank's trace shows it (the comm thread's "dp ..." events against
// the compute thread's forward and backward), the exposed wait, and rank 0's peak bytes of
// parameters, gradients and optimizer state.
#include <fmt/format.h>

#include <algorithm>
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
#include "core/thread_budget.h"
#include "trace/event_recorder.h"
#include "trace/trace_summary.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace lattice::cli {
namespace {

struct BenchDpArgs {
  std::string config;
  std::vector<std::string> overrides;
  int dp = 2;
  std::vector<int> zero{0, 1, 2, 3};
  int steps = 100;
  int warmup = 20;
  int repeat = 2;
};

struct Layout {
  int dp = 1;
  int zero = 0;
};

struct LayoutSamples {
  std::vector<double> step_ms;  // rank 0, every timed step of every repetition
  int64_t dp_ns = 0;            // rank 0's data-parallel communication (trace), timed steps
  int64_t hidden_ns = 0;        // the part of it during forward/backward
  int64_t wait_ns = 0;          // rank 0 waiting for it (trace: idle "wait for ..." events)
  size_t peak_parameters = 0, peak_gradients = 0, peak_optimizer = 0;
  double last_loss = 0;
};

void run_layout(const BenchDpArgs& args, const TrainConfig& base, Layout layout,
                LayoutSamples& samples) {
  TrainConfig config = base;
  config.eval_interval = 0;
  config.out_dir.clear();
  const TraceClock::time_point origin = TraceClock::now();
  ThreadWorldOptions world;
  world.config.timeout = std::chrono::minutes(5);  // a loaded machine, not a lost peer
  run_ranks(
      layout.dp,
      [&](Communicator& comm) {
        Arena arena(fmt::format("rank{}", comm.rank()));
        const int64_t bucket_bytes = int64_t(config.parallel.bucket_mb * double(1 << 20));
        Trainer trainer(
            config, arena,
            {.dp = &comm, .zero = layout.zero, .bucket_bytes = bucket_bytes, .threads = 1});
        EventRecorder recorder(comm.rank(), origin, /*enabled=*/false);
        ScopedCurrentRecorder current(&recorder);
        std::vector<double> ms;
        double loss = 0;
        for (int s = 0; s < args.warmup + args.steps; ++s) {
          if (s == args.warmup) recorder.set_enabled(true);
          const StepMetrics m = trainer.train_step();
          if (s >= args.warmup) ms.push_back(m.ms);
          loss = m.loss;
        }
        if (comm.rank() != 0) return;
        std::vector<TraceEvent> dp_and_compute;
        for (TraceEvent& event : recorder.events()) {
          if (event.name.starts_with("wait for gradient") ||
              event.name.starts_with("wait for gathered")) {
            samples.wait_ns += event.duration_ns();
          }
          if (event.category == TraceCategory::kCompute || event.name.starts_with("dp ")) {
            dp_and_compute.push_back(std::move(event));
          }
        }
        const RankTraceSummary summary = summarize_rank_trace(0, dp_and_compute);
        samples.dp_ns += summary.busy(TraceCategory::kCollective);
        samples.hidden_ns += summary.collective_hidden_ns;
        samples.step_ms.insert(samples.step_ms.end(), ms.begin(), ms.end());
        const MemoryStats stats = arena.stats();
        auto peak = [&](MemoryCategory c) { return stats.peak_by_category[size_t(c)]; };
        samples.peak_parameters = peak(MemoryCategory::kParameters);
        samples.peak_gradients = peak(MemoryCategory::kGradients);
        samples.peak_optimizer = peak(MemoryCategory::kOptimizerState);
        samples.last_loss = loss;
      },
      world);
}

void run_bench_dp(const BenchDpArgs& args) {
  TrainConfig base = load_train_config(args.config, args.overrides);
  if (base.global_batch == 0) {
    // One global batch for every layout: a config that leaves it to be derived gets the one of
    // the widest layout (micro_batch × micro_batches × --dp), and dp = 1 runs it in more
    // micro-batches. Resolved per layout instead, dp = N would train on N times the batch.
    TrainConfig widest = base;
    widest.resolve_batch(args.dp);
    base.global_batch = widest.global_batch;
    base.micro_batch = widest.micro_batch;
    base.micro_batches = 0;
  }
  if (args.dp > available_cores()) {
    LATTICE_THROW(ConfigError,
                  "bench dp: --dp {} ranks of one thread need {} cores but {} are available "
                  "---> HINT: an oversubscribed run measures the scheduler; lower --dp",
                  args.dp, args.dp, available_cores());
  }
  std::vector<Layout> layouts{{1, 0}};
  for (int zero : args.zero) layouts.push_back({args.dp, zero});
  std::vector<LayoutSamples> samples(layouts.size());
  fmt::print(
      "# lattice bench dp: {} ({}), global batch {} x T={}, {} warm-up + {} timed steps, {} "
      "repetition(s) in turn, 1 thread per rank, buckets of {} MB (parallel.bucket_mb), threads "
      "transport\n",
      args.config, base.model.name, base.global_batch, base.seq_len, args.warmup, args.steps,
      args.repeat, base.parallel.bucket_mb);
  fmt::print("# machine at start: {}\n", machine_state());
  for (int r = 0; r < args.repeat; ++r) {
    for (size_t i = 0; i < layouts.size(); ++i) run_layout(args, base, layouts[i], samples[i]);
  }
  fmt::print(
      "# ms/step: median of rank 0's step times; dp comm: the comm thread's reductions and "
      "gathers per step (trace), hidden: the share of it while rank 0 ran forward/backward; "
      "wait: rank 0 blocked on it per step; peaks: rank 0's arena, MiB\n");
  fmt::print("# {:>3} {:>5} {:>9} {:>10} {:>12} {:>7} {:>8} {:>7} {:>7} {:>9} {:>10}\n", "dp",
             "zero", "ms/step", "vs dp=1", "dp comm ms", "hidden", "wait ms", "params", "grads",
             "optimizer", "last loss");
  const double baseline = median(samples[0].step_ms);
  const double steps = double(args.steps) * double(args.repeat);
  for (size_t i = 0; i < layouts.size(); ++i) {
    const LayoutSamples& s = samples[i];
    const double ms = median(s.step_ms);
    const bool dp = layouts[i].dp > 1;
    fmt::print(
        "  {:>3} {:>5} {:>9.2f} {:>9.2f}x {:>12} {:>7} {:>8} {:>7.2f} {:>7.2f} {:>9.2f} "
        "{:>10.4f}\n",
        layouts[i].dp, dp ? std::to_string(layouts[i].zero) : "-", ms, baseline / ms,
        dp ? fmt::format("{:.2f}", double(s.dp_ns) / 1e6 / steps) : "-",
        dp && s.dp_ns > 0 ? fmt::format("{:.0f}%", 100.0 * double(s.hidden_ns) / double(s.dp_ns))
                          : "-",
        dp ? fmt::format("{:.2f}", double(s.wait_ns) / 1e6 / steps) : "-",
        double(s.peak_parameters) / (1 << 20), double(s.peak_gradients) / (1 << 20),
        double(s.peak_optimizer) / (1 << 20), s.last_loss);
  }
  fmt::print("# machine at end: {}\n", machine_state());
  std::fflush(stdout);
}

}  // namespace

void register_bench_dp_command(CLI::App& app) {
  CLI::App* bench = bench_parent(app);
  auto args = std::make_shared<BenchDpArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "dp", "Training steps at dp = 1 and dp = N per ZeRO stage: ms/step, overlap, memory");
  cmd->add_option("config", args->config, "training config (TOML); its data must be prepared")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", args->overrides, "override a config key, e.g. train.seq_len=64");
  cmd->add_option("--dp", args->dp, "data-parallel ranks of the compared layouts")
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--zero", args->zero, "ZeRO stages to run at --dp, e.g. 0,3")
      ->delimiter(',')
      ->check(CLI::Range(0, 3));
  cmd->add_option("--steps", args->steps, "timed steps per layout and repetition")
      ->check(positive_number());
  cmd->add_option("--warmup", args->warmup, "untimed steps first")->check(non_negative_number());
  cmd->add_option("--repeat", args->repeat, "run the layouts this many times in turn")
      ->check(positive_number());
  cmd->callback([args] { run_bench_dp(*args); });
}

}  // namespace lattice::cli
