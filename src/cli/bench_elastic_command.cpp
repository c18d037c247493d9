// `lattice bench elastic`: what a failure costs an elastic run, next to the uninterrupted run.
//
//   lattice bench elastic configs/shakespeare-char.toml --nproc 2 --steps 60 --fault-step 30
//       [--repeat 3] [--warmup 5] [--kinds kill,stop,hang,throw] [--set key=value ...]
//
// Runs `lattice launch --nproc-per-node N -- train CONFIG --dp N` (one after another, in this
// process's agent): without snapshots and with a snapshot after every step, alternating,
// `--repeat` rounds (the snapshot's overhead: the ratio of their median step times, rank 0's,
// past `--warmup` steps of each run, and the snapshot's own time on rank 0), then once per fault
// kind with LATTICE_FAULT=kind@backward:1:STEP: the agent's detection time (from the rank's last
// sign of life), its recovery time (from detection to the first step trained after the restore),
// the steps lost (the step in flight, fault step + 1, down to the snapshot restored: the fault
// fires in the step after `--fault-step` were done) and their sum as time, the lost
// steps priced at the median step (the runs' wall times differ by more than that on a busy
// machine).
#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_parent.h"
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "cli/launch_options.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/timer.h"

namespace lattice::cli {
namespace {

struct BenchElasticArgs {
  std::string config;
  std::vector<std::string> overrides;
  int nproc = 2;
  int steps = 60;
  int fault_step = 30;
  int repeat = 3;  // alternating rounds of the two uninterrupted runs
  int warmup = 5;  // steps of each run left out of its step times
  std::vector<std::string> kinds{"kill", "stop", "hang", "throw"};
};

struct ElasticRun {
  double wall_s = 0;
  std::vector<double> step_ms;      // rank 0's, after the warm-up
  std::vector<double> snapshot_ms;  // of which the snapshot's
  std::vector<RankFailure> failures;
  int exit_code = 0;
};

// Rank 0's step times in the training loop (loop_ms: the snapshot's write after the step
// included) in a metrics file (JSON lines), past the first `warmup` steps, and the snapshot's
// part of each (snapshot_ms, 0 without one).
void read_step_times(const std::filesystem::path& metrics, int warmup, ElasticRun& run) {
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("step").get<int>() <= warmup) continue;
    run.step_ms.push_back(j.at("loop_ms").get<double>());
    run.snapshot_ms.push_back(j.value("snapshot_ms", 0.0));
  }
}

ElasticRun run_once(const BenchElasticArgs& args, const std::vector<std::string>& sets,
                    const std::string& fault) {
  const std::filesystem::path scratch =
      std::filesystem::temp_directory_path() / fmt::format("lattice_bench_elastic_{}", getpid());
  std::filesystem::create_directories(scratch);
  const std::filesystem::path metrics = scratch / "metrics.jsonl";
  std::vector<std::string> command = {
      "train",     args.config,      "--dp",  std::to_string(args.nproc),
      "--metrics", metrics.string(), "--set", fmt::format("train.steps={}", args.steps),
      "--set",     "output.dir=",    "--set", "sample.tokens=0"};
  for (const std::string& s : args.overrides) command.insert(command.end(), {"--set", s});
  for (const std::string& s : sets) command.insert(command.end(), {"--set", s});
  AgentOptions options = launch_options(args.nproc, command);
  options.rank_output = scratch / "ranks.log";
  if (fault.empty()) {
    ::unsetenv("LATTICE_FAULT");
  } else {
    ::setenv("LATTICE_FAULT", fault.c_str(), 1);
  }
  ElasticRun run;
  Stopwatch wall;
  {
    Agent agent(std::move(options));
    run.exit_code = agent.run();
    run.failures = agent.failures();
  }
  run.wall_s = wall.seconds();
  read_step_times(metrics, args.warmup, run);
  ::unsetenv("LATTICE_FAULT");
  if (run.exit_code != 0) {
    LATTICE_THROW(CommError,
                  "bench elastic: the run with LATTICE_FAULT='{}' failed; its ranks' "
                  "output is in {}",
                  fault, (scratch / "ranks.log").string());
  }
  std::filesystem::remove_all(scratch);
  return run;
}

void run_bench_elastic(const BenchElasticArgs& args) {
  if (args.fault_step < 1 || args.fault_step >= args.steps) {
    LATTICE_THROW(ConfigError, "--fault-step {} must lie inside the run's {} steps",
                  args.fault_step, args.steps);
  }
  fmt::print("# lattice bench elastic: {} on {} rank processes (gloo), {} steps; {}\n", args.config,
             args.nproc, args.steps, machine_state());
  // The two uninterrupted runs alternate, so that a change in the machine's load hits both.
  std::vector<double> plain_ms, snapshot_ms, snapshot_part_ms;
  double plain_wall = 0, snapshot_wall = 0;
  for (int round = 0; round < args.repeat; ++round) {
    const ElasticRun plain = run_once(args, {"elastic.snapshot_every=0"}, "");
    const ElasticRun snapshots = run_once(args, {}, "");
    plain_ms.insert(plain_ms.end(), plain.step_ms.begin(), plain.step_ms.end());
    snapshot_ms.insert(snapshot_ms.end(), snapshots.step_ms.begin(), snapshots.step_ms.end());
    snapshot_part_ms.insert(snapshot_part_ms.end(), snapshots.snapshot_ms.begin(),
                            snapshots.snapshot_ms.end());
    plain_wall += plain.wall_s / args.repeat;
    snapshot_wall += snapshots.wall_s / args.repeat;
  }
  const double plain_median = median(plain_ms), snapshot_median = median(snapshot_ms);
  const double plain_mean = mean(plain_ms), snapshot_mean = mean(snapshot_ms);
  fmt::print(
      "uninterrupted, no snapshots:     {:8.2f} ms/step mean, {:.2f} median (of {} steps), {:.2f} "
      "s wall\n",
      plain_mean, plain_median, plain_ms.size(), plain_wall);
  fmt::print(
      "uninterrupted, snapshot a step:  {:8.2f} ms/step mean, {:.2f} median (of {} steps), {:.2f} "
      "s wall: snapshot overhead {:+.1f}% of the step (mean; median {:+.1f}%)\n",
      snapshot_mean, snapshot_median, snapshot_ms.size(), snapshot_wall,
      100.0 * (snapshot_mean / plain_mean - 1.0), 100.0 * (snapshot_median / plain_median - 1.0));
  // The loop times' ratio carries the machine's noise; the write's own time does not.
  fmt::print(
      "the snapshot's own time on rank 0:  {:.3f} ms mean, {:.3f} median a step = {:.1f}% of the "
      "median step without snapshots\n",
      mean(snapshot_part_ms), median(snapshot_part_ms),
      100.0 * median(snapshot_part_ms) / plain_median);
  fmt::print("\n{:<8} {:>12} {:>12} {:>11} {:>14}  cause\n", "fault", "detection s", "recovery s",
             "steps lost", "cost s");
  for (const std::string& kind : args.kinds) {
    const std::string fault = fmt::format("{}@backward:1:{}", kind, args.fault_step);
    const ElasticRun run = run_once(args, {}, fault);
    if (run.failures.empty()) {
      fmt::print("{:<8} the fault was not seen\n", kind);
      continue;
    }
    const RankFailure& f = run.failures.front();
    fmt::print("{:<8} {:>12.3f} {:>12.3f} {:>11} {:>14.2f}  {}\n", kind, f.detected_after_s,
               f.recovery_s, args.fault_step + 1 - f.restored_step,
               f.detected_after_s + f.recovery_s +
                   double(args.fault_step + 1 - f.restored_step) * snapshot_median / 1e3,
               f.cause);
  }
  fmt::print("# machine at end: {}\n", machine_state());
}

}  // namespace

void register_bench_elastic_command(CLI::App& app) {
  auto args = std::make_shared<BenchElasticArgs>();
  CLI::App* bench = bench_parent(app);
  CLI::App* cmd = bench->add_subcommand(
      "elastic", "Detection, recovery and snapshot cost of each fault kind under lattice launch");
  cmd->add_option("config", args->config, "The TOML config")->required();
  cmd->add_option("--set", args->overrides, "Override a config key: section.key=value");
  cmd->add_option("--nproc", args->nproc, "Rank processes")->check(CLI::Range(2, 64));
  cmd->add_option("--steps", args->steps, "Steps of each run")->check(positive_number());
  cmd->add_option("--fault-step", args->fault_step, "The step each fault fires in (rank 1)");
  cmd->add_option("--repeat", args->repeat, "Alternating rounds of the uninterrupted runs")
      ->check(positive_number());
  cmd->add_option("--warmup", args->warmup, "Steps of each run left out of its step times")
      ->check(non_negative_number());
  cmd->add_option("--kinds", args->kinds, "Fault kinds: kill, stop, hang, throw")->delimiter(',');
  cmd->callback([args] { run_bench_elastic(*args); });
}

}  // namespace lattice::cli
