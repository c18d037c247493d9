// `lattice launch --nproc-per-node N [--max-restarts K] [--min-ranks R] [--spares S]
// [--grace-s S] -- train CONFIG [flags]`: the elastic engine on one machine (docs/elastic.md).
// The agent starts N rank processes of `lattice train ... --transport gloo` (and S idle
// spares), watches their heartbeats and progress, keeps their in-memory snapshots, and when a
// rank dies, stops or hangs replaces it (a spare or a new process) while the survivors rejoin
// the next generation in their processes, all from the newest snapshot. SIGTERM (preemption)
// is forwarded: the ranks finish their step, write a durable checkpoint under output.dir and
// exit 0.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/launch_options.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/stop_request.h"
#include "elastic/agent.h"
#include "train/train_config.h"

namespace lattice::cli {

namespace {

struct LaunchArgs {
  int nproc_per_node = 1;
  int max_restarts = 3;
  int min_ranks = 0;  // 0: --nproc-per-node (no shrinking)
  int spares = 0;
  double grace_s = 30.0;
  int cores_per_rank = 0;  // 0: the ranks share the agent's cores
  std::vector<std::string> command;
};

void run_launch(const LaunchArgs& args) {
  AgentOptions options = launch_options(args.nproc_per_node, args.command);
  options.max_restarts = args.max_restarts;
  options.min_ranks = args.min_ranks > 0 ? args.min_ranks : args.nproc_per_node;
  options.grace_s = args.grace_s;
  options.spares = args.spares;
  options.cores_per_rank = args.cores_per_rank;
  install_stop_request_handlers();
  Agent agent(std::move(options));
  if (agent.run() != 0) {
    LATTICE_THROW(CommError, "lattice launch: the job failed ({} rank failure(s) seen)",
                  agent.failures().size());
  }
}

}  // namespace

AgentOptions launch_options(int nproc, std::vector<std::string> command) {
  // `doctor --env`: every rank process reports its launch environment (docs/doctor.md).
  if (!command.empty() && command[0] == "doctor" &&
      std::find(command.begin(), command.end(), "--env") != command.end()) {
    AgentOptions options;
    options.nproc = nproc;
    options.command = std::move(command);
    options.executable = std::filesystem::read_symlink("/proc/self/exe");
    return options;
  }
  if (command.size() < 2 || command[0] != "train") {
    LATTICE_THROW(ConfigError,
                  "lattice launch runs `train CONFIG [flags]` or `doctor --env` after `--` ---> "
                  "HINT: lattice launch --nproc-per-node 4 -- train configs/shakespeare-char.toml "
                  "--dp 4");
  }
  std::vector<std::string> overrides;
  for (size_t i = 2; i < command.size(); ++i) {
    if (command[i] == "--set" && i + 1 < command.size()) overrides.push_back(command[++i]);
    if (command[i].starts_with("--set=")) overrides.push_back(command[i].substr(6));
  }
  TrainConfig config = load_train_config(command[1], overrides);
  config.parallel.transport = TransportKind::kGloo;
  config.check_timeout_ladder();
  AgentOptions options;
  options.nproc = nproc;
  options.command = std::move(command);
  options.executable = std::filesystem::read_symlink("/proc/self/exe");
  options.elastic = config.elastic;
  return options;
}

void register_launch_command(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "Run a training job as elastic rank processes that recover from failures");
  cmd->add_option("--nproc-per-node", args->nproc_per_node, "Rank processes on this machine")
      ->check(positive_number());
  cmd->add_option("--max-restarts", args->max_restarts,
                  "Failures of one rank the job recovers from before it ends")
      ->check(non_negative_number());
  cmd->add_option("--min-ranks", args->min_ranks,
                  "Go on with fewer ranks, down to this many, when one fails more than "
                  "--max-restarts times (default: --nproc-per-node, never shrink)")
      ->check(positive_number());
  cmd->add_option("--spares", args->spares,
                  "Extra processes started idle; a failed rank's place goes to one of them")
      ->check(non_negative_number());
  cmd->add_option("--cores-per-rank", args->cores_per_rank,
                  "Bind rank r (and any replacement of it) to the r-th block of this many of the "
                  "agent's cores, e.g. train.threads; default 0: the ranks share the cores")
      ->check(non_negative_number());
  cmd->add_option("--grace-s", args->grace_s,
                  "After SIGTERM: seconds the ranks have to finish their step and checkpoint")
      ->check(positive_number());
  cmd->add_option("command", args->command, "The rank command after --: train CONFIG [train flags]")
      ->required();
  cmd->callback([args] { run_launch(*args); });
}

}  // namespace lattice::cli
