// `lattice launch --nproc-per-node N [--nnodes M --node-rank K --rdzv HOST:PORT --secret-file F]
// [--max-restarts K] [--min-ranks R] [--spares S] [--grace-s S] -- train CONFIG [flags]`: the
// elastic engine, one agent per machine (docs/elastic.md).
// The agent starts N rank processes of `lattice train ... --transport gloo` (and S idle
// spares), watches their heartbeats and progress, keeps their in-memory snapshots, and when a
// rank dies, stops or hangs replaces it (a spare or a new process) while the survivors rejoin
// the next generation in their processes, all from the newest snapshot. SIGTERM (preemption)
// is forwarded: the ranks finish their step, write a durable checkpoint under output.dir and
// exit 0.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/launch_options.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/stop_request.h"
#include "doctor/doctor.h"
#include "doctor/machine.h"
#include "doctor/probe.h"
#include "elastic/agent.h"
#include "elastic/job_secret.h"
#include "elastic/static_relaunch.h"
#include "train/train_config.h"

namespace lattice::cli {

namespace {

struct LaunchArgs {
  int nproc_per_node = 1;
  int max_restarts = 3;
  int min_ranks = 0;  // 0: every rank of the job (no shrinking)
  int spares = 0;
  double grace_s = 30.0;
  int cores_per_rank = 0;  // 0: the ranks share the agent's cores
  int nnodes = 1;
  int node_rank = 0;
  std::string rdzv;
  std::string secret_file;
  std::string bind_addr;
  double rdzv_timeout_s = 60;
  bool no_preflight = false;
  std::vector<std::string> command;
};

// Before any rank starts: the doctor's timeouts check (`lattice doctor --transport gloo`) on a
// probe of the command's layout, so that a collective deadline the predicted step overruns is
// refused once, here, with its fix, instead of failing every rank in turn. A probe that cannot
// run is reported and left to the ranks, whose own errors name the cause.
void check_timeouts_before_start(const std::vector<std::string>& command) {
  TrainConfig config = parse_train_command(command);
  config.parallel.transport = TransportKind::kGloo;
  doctor::DoctorInput input{.config = config, .machine = doctor::observe_machine()};
  try {
    input.probe = doctor::run_probe(config, {.compare = false});
  } catch (const Error& e) {
    fmt::print("preflight: the timeouts were not checked: the probe failed: {}\n", e.what());
    std::fflush(stdout);
    return;
  }
  for (const doctor::DoctorCheck& check : doctor::doctor_checks()) {
    if (check.id != "timeouts") continue;
    doctor::CheckResult r = check.run(input);
    r.id = check.id;
    r.title = check.title;
    fmt::print("preflight (lattice doctor --transport gloo, probe of {:.2f} s):\n{}\n",
               input.probe->seconds, doctor::format_results({r}));
    std::fflush(stdout);
    if (r.verdict == doctor::Verdict::kFail) {
      LATTICE_THROW(ConfigError, "lattice launch: the timeouts check failed: {} ---> HINT: {}",
                    r.saw, r.fix);
    }
  }
}

// The job's secret: LATTICE_JOB_SECRET, or --secret-file (agent 0 writes a new one there when it
// does not exist; the others read it), or, on one node, a fresh one nobody else needs.
std::string job_secret(const LaunchArgs& args) {
  if (const char* env = std::getenv("LATTICE_JOB_SECRET"); env != nullptr && *env != '\0') {
    return env;
  }
  if (!args.secret_file.empty()) {
    if (std::optional<std::string> secret = read_job_secret(args.secret_file)) return *secret;
    if (args.node_rank == 0) {
      const std::string secret = make_job_secret();
      write_job_secret(args.secret_file, secret);
      return secret;
    }
    // On a shared directory agent 0 may write it a moment after this agent starts.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(int64_t(args.rdzv_timeout_s * 1e3));
    while (std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (std::optional<std::string> secret = read_job_secret(args.secret_file)) return *secret;
    }
    LATTICE_THROW(ConfigError,
                  "--secret-file {} did not appear within {} s ---> HINT: agent 0 (--node-rank "
                  "0) writes it; copy it to this node (mode 600) or share the directory",
                  args.secret_file, args.rdzv_timeout_s);
  }
  if (args.nnodes > 1) {
    LATTICE_THROW(ConfigError,
                  "--nnodes {} needs the job's secret on every agent: --secret-file F (agent 0 "
                  "writes it) or LATTICE_JOB_SECRET ---> HINT: lattice launch --nnodes {} "
                  "--node-rank K --rdzv HOST:PORT --secret-file ~/.lattice-job-secret ...",
                  args.nnodes, args.nnodes);
  }
  return make_job_secret();
}

// The command asks for the static engine (--transport mpi).
bool wants_mpi(const std::vector<std::string>& command) {
  for (size_t i = 0; i < command.size(); ++i) {
    if (command[i] == "--transport=mpi") return true;
    if (command[i] == "--transport" && i + 1 < command.size() && command[i + 1] == "mpi") {
      return true;
    }
  }
  return false;
}

void run_launch(const LaunchArgs& args) {
  if (wants_mpi(args.command)) {
    if (args.nnodes > 1) {
      LATTICE_THROW(ConfigError,
                    "lattice launch --nnodes with --transport mpi: across machines the static "
                    "engine is mpirun's or srun's own launch ---> HINT: mpirun -np N --hostfile "
                    "F lattice train ... --transport mpi, or drop --transport mpi for the "
                    "elastic engine");
    }
    // The config, its timeouts and its world, checked.
    launch_options(args.nproc_per_node, args.command, args.nnodes);
    StaticRelaunchOptions options;
    options.nproc = args.nproc_per_node;
    options.max_restarts = args.max_restarts;
    options.grace_s = args.grace_s;
    options.command = args.command;
    options.executable = std::filesystem::read_symlink("/proc/self/exe");
    const std::filesystem::path faults =
        std::filesystem::temp_directory_path() / fmt::format("lattice-faults-{}", ::getpid());
    std::filesystem::create_directories(faults);
    options.fault_dir = faults;
    install_stop_request_handlers();
    const int code = run_static_relaunch(options);
    std::error_code ec;
    std::filesystem::remove_all(faults, ec);
    if (code != 0) LATTICE_THROW(CommError, "lattice launch: the MPI job failed (code {})", code);
    return;
  }
  AgentOptions options = launch_options(args.nproc_per_node, args.command, args.nnodes);
  if (!args.no_preflight && args.command.front() == "train") {
    check_timeouts_before_start(args.command);
  }
  options.max_restarts = args.max_restarts;
  options.grace_s = args.grace_s;
  options.spares = args.spares;
  options.cores_per_rank = args.cores_per_rank;
  options.nnodes = args.nnodes;
  options.node_rank = args.node_rank;
  options.rdzv = args.rdzv;
  options.bind_addr = args.bind_addr;
  options.rdzv_timeout_s = args.rdzv_timeout_s;
  options.min_ranks = args.min_ranks > 0 ? args.min_ranks : args.nproc_per_node * args.nnodes;
  options.secret = job_secret(args);
  install_stop_request_handlers();
  Agent agent(std::move(options));
  if (agent.run() != 0) {
    LATTICE_THROW(CommError, "lattice launch: the job failed ({} rank failure(s) seen)",
                  agent.failures().size());
  }
}

// The job's ranks must be the layout's pp × dp × cp × tp: refused once here, before any rank
// starts, rather than by every rank's mesh check (whose hint, mpirun -np, is the wrong fix
// under launch).
void refuse_world_mismatch(const ParallelConfig& layout, int world) {
  if (layout.world_size() == world) return;
  const int others = layout.pp * layout.cp * layout.tp;
  const std::string fix =
      world % others == 0
          ? fmt::format("add --dp {} after `train CONFIG` (pp {} x dp {} x cp {} x tp {} = {})",
                        world / others, layout.pp, world / others, layout.cp, layout.tp, world)
          : fmt::format(
                "choose --pp, --dp, --cp and --tp whose product is {}, or run "
                "--nproc-per-node x --nnodes = {} ranks",
                world, layout.world_size());
  LATTICE_THROW(ConfigError,
                "lattice launch starts a world of {} ranks, but the layout pp {} x dp {} x cp {} "
                "x tp {} needs {} ---> HINT: {}",
                world, layout.pp, layout.dp, layout.cp, layout.tp, layout.world_size(), fix);
}

}  // namespace

AgentOptions launch_options(int nproc, std::vector<std::string> command, int nnodes) {
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
  TrainConfig config = parse_train_command(command);
  config.parallel.transport = TransportKind::kGloo;
  config.check_timeout_ladder();
  refuse_world_mismatch(config.parallel, nproc * nnodes);
  AgentOptions options;
  options.nproc = nproc;
  options.command = std::move(command);
  options.executable = std::filesystem::read_symlink("/proc/self/exe");
  options.elastic = config.elastic;
  options.collective_timeout_s = config.collective_timeout_s();
  options.fitting_worlds = config.refittable_worlds();
  return options;
}

void register_launch_command(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "Run a training job as elastic rank processes that recover from failures");
  cmd->add_option("--nproc-per-node", args->nproc_per_node, "Rank processes on this machine")
      ->check(positive_number());
  cmd->add_option("--nnodes", args->nnodes, "Machines of the job, one agent on each")
      ->check(positive_number());
  cmd->add_option("--node-rank", args->node_rank,
                  "This machine's agent, 0 .. --nnodes - 1; agent 0 serves the store and decides")
      ->check(non_negative_number());
  cmd->add_option("--rdzv", args->rdzv,
                  "HOST:PORT of agent 0's store (an address of agent 0's machine), the same on "
                  "every node (--nnodes > 1)");
  cmd->add_option("--secret-file", args->secret_file,
                  "The job's secret (mode 600): agent 0 writes a new one when it does not exist, "
                  "the others read it; or set LATTICE_JOB_SECRET");
  cmd->add_option("--bind-addr", args->bind_addr,
                  "The address this node's ranks connect from (default: the one that reaches "
                  "--rdzv)");
  cmd->add_option("--rdzv-timeout-s", args->rdzv_timeout_s,
                  "How long the agents wait for each other at the start")
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
  cmd->add_flag("--no-preflight", args->no_preflight,
                "Start the ranks without first probing the layout for the doctor's timeouts "
                "check (the collective deadline against the predicted step)");
  cmd->add_option("command", args->command, "The rank command after --: train CONFIG [train flags]")
      ->required();
  cmd->callback([args] { run_launch(*args); });
}

}  // namespace lattice::cli
