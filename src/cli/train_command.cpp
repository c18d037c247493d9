// `lattice train CONFIG.toml [--set key=value ...] [--metrics FILE] [--dp N --zero 0|1|2|3 ...]
// [--tp N [--sp]] [--pp N ...] [--transport threads|mpi|gloo]`: parses and checks the command,
// starts the ranks of the pp × dp × tp mesh (tp fastest) on in-process threads, under mpirun on
// MPI, or under `lattice launch` on Gloo (one generation after another), and runs each rank's
// training (run/training_run.h: the loop, checkpoints, snapshots, evaluation, sampling). The
// layout comes from the config's [parallel] section; a layout flag given on the command line
// overrides its key.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/layout_flags.h"
#include "cli/validators.h"
#include "comm/launch.h"
#include "core/stop_request.h"
#include "core/thread_budget.h"
#include "doctor/doctor.h"
#include "elastic/elastic_rank.h"
#include "elastic/rank_session.h"
#include "forecast/forecast.h"
#include "model/moe_router.h"
#include "model/parameters.h"
#include "parallel/context_parallel.h"
#include "parallel/device_mesh.h"
#include "run/training_run.h"
#include "train/train_config.h"

namespace lattice::cli {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  RunOptions run;              // --metrics, --init-from, --trace, --resume, --resume-allow-change
  LayoutFlags layout;          // --dp, --tp, ... over the config's [parallel] keys
  bool ckpt_async = false;     // --ckpt-async (output.checkpoint_async)
  bool oversubscribe = false;  // more in-process ranks than cores: one thread each
  bool preflight = false;      // the doctor's static checks first (lattice doctor --no-probe)
  std::string plan;            // --plan CLUSTER: the planner's forecast into metrics/run.json
};

// An agent that went on with fewer ranks (lattice launch --min-ranks) runs the command as it
// was given in a smaller world: the layout is refit to it, the global batch kept.
TrainConfig refit_to_shrunk_world(const TrainConfig& config, const Assignment& assignment) {
  if (!assignment.refit || assignment.world == config.parallel.world_size()) return config;
  TrainConfig before = config;
  before.resolve_batch(before.parallel.dp);
  TrainConfig refit = config;
  refit.refit_to_world(assignment.world);
  if (assignment.rank == 0) {
    fmt::print(
        "world of {} ranks: dp {} -> {}{}, micro-batch {} x {} -> {} x {} per rank, global batch "
        "{} kept\n",
        assignment.world, before.parallel.dp, refit.parallel.dp,
        before.parallel.ep > 1 ? fmt::format(", ep {} -> {}", before.parallel.ep, refit.parallel.ep)
                               : std::string(),
        before.micro_batch, before.micro_batches, refit.micro_batch, refit.micro_batches,
        refit.global_batch);
  }
  return refit;
}

// `--preflight`: the doctor's checks that need no probe, printed; ConfigError when one fails,
// before any rank starts.
void run_preflight(const TrainConfig& config, const TrainArgs& args) {
  doctor::DoctorInput input{.config = config,
                            .machine = doctor::observe_machine(),
                            .oversubscribe = args.oversubscribe,
                            .resume_from = std::nullopt,
                            .probe = std::nullopt};
  if (!args.run.resume.empty() && args.run.resume != "auto") input.resume_from = args.run.resume;
  if (!args.run.init_from.empty()) input.init_from = args.run.init_from;
  const std::vector<doctor::CheckResult> results = doctor::run_checks(input);
  fmt::print("preflight (lattice doctor --no-probe):\n{}\n", doctor::format_results(results));
  std::vector<std::string> failed;
  for (const doctor::CheckResult& r : results)
    if (r.verdict == doctor::Verdict::kFail) failed.push_back(r.id);
  if (!failed.empty()) {
    LATTICE_THROW(ConfigError,
                  "preflight: {} check(s) failed ({}) ---> HINT: each one's fix is printed above",
                  failed.size(), fmt::join(failed, ", "));
  }
}

// `--plan CLUSTER`: the run's options with the planner's forecast of `config` (each generation
// of an elastic run is forecast on its own layout).
RunOptions with_forecast(const RunOptions& run, const TrainConfig& config,
                         const std::optional<plan::ClusterSpec>& cluster,
                         const std::string& source) {
  RunOptions out = run;
  if (cluster) out.plan = forecast_run(config, *cluster, source);
  return out;
}

MeshShape mesh_shape(const ParallelConfig& layout) {
  return {.pp = layout.pp, .dp = layout.dp, .tp = layout.tp, .cp = layout.cp, .ep = layout.ep};
}

// The config a `train` command line gives: the file, its --set overrides, the layout flags.
TrainConfig resolve_train_config(const TrainArgs& args, const CLI::App& cmd) {
  TrainConfig config = resolve_layout_config(args.config, args.overrides, cmd, args.layout);
  if (cmd.count("--ckpt-async") > 0) config.checkpoint_async = args.ckpt_async;
  return config;
}

void run_train(const TrainArgs& args, const CLI::App& cmd) {
  TrainConfig config = resolve_train_config(args, cmd);
  if (args.preflight) run_preflight(config, args);
  const TransportKind transport = config.parallel.transport;
  const ParallelConfig& layout = config.parallel;
  const MeshShape shape = mesh_shape(layout);
  // Everything that can be checked before a rank starts is checked here, once.
  validate_tensor_parallel(config.model, {layout.tp, 0, layout.sequence_parallel});
  validate_context_parallel(layout.cp, config.seq_len);
  validate_moe_layout(config.model, layout.cp,
                      layout.pp > 1 && layout.schedule == ScheduleKind::kZeroBubbleH1, layout.ep,
                      layout.dp, layout.zero);
  const int cores = available_cores();
  const int world = shape.world_size();
  if (transport == TransportKind::kThreads && world * std::max(1, config.threads) > cores) {
    if (!args.oversubscribe) {
      LATTICE_THROW(ConfigError,
                    "{} in-process ranks (dp {} x tp {} x pp {}{}) with train.threads = {} need "
                    "{} cores but {} are available ---> HINT: ranks x threads must not exceed the "
                    "cores; lower --dp, --tp, --pp, --cp (parallel.dp, .tp, .pp, .cp) or "
                    "train.threads, run under mpirun with --transport mpi, or pass "
                    "--oversubscribe to try the layout anyway (one thread per rank; the results "
                    "are exact, the timings are not)",
                    world, layout.dp, layout.tp, layout.pp,
                    layout.cp > 1 ? fmt::format(" x cp {}", layout.cp) : "", config.threads,
                    world * std::max(1, config.threads), cores);
    }
    spdlog::warn(
        "--oversubscribe: {} in-process ranks on {} cores, one thread each{}: the losses and "
        "checkpoints are those of the layout, but the step times, tokens/s and MFU measure "
        "the scheduler, not the layout",
        world, cores,
        config.threads > 1 ? fmt::format(" (train.threads = {} ignored)", config.threads) : "");
    config.threads = 1;
  }
  config.check_timeout_ladder();
  CommConfig comm_config;
  comm_config.timeout = std::chrono::milliseconds(int64_t(config.collective_timeout_s() * 1e3));
  comm_config.algorithms =
      layout.deterministic ? AlgorithmChoice::kPinned : AlgorithmChoice::kRetunedAtStepBoundary;
  if (!layout.comm_profile.empty()) {
    comm_config.profile = CostProfile::load(layout.comm_profile, transport);
  }
  std::optional<plan::ClusterSpec> plan_cluster;
  if (!args.plan.empty()) {
    if (config.out_dir.empty()) {
      LATTICE_THROW(ConfigError,
                    "--plan {}: the forecast is kept in output.dir/metrics/run.json for lattice "
                    "report, and the config sets no output.dir ---> HINT: --set output.dir=DIR",
                    args.plan);
    }
    plan_cluster = plan::resolve_cluster(args.plan);
  }
  install_stop_request_handlers();  // SIGTERM: finish the step, checkpoint, exit 0
  RunOptions run = args.run;
  run.trace_origin = TraceClock::now();  // shared by this process's ranks
  if (transport == TransportKind::kGloo && detect_agent_link()) {
    // A rank process of `lattice launch`: it joins each generation its agent assigns, and
    // outlives the ones that lose a peer.
    RankSession session(0, config.elastic);
    run_elastic_rank(
        session,
        [&](Communicator& comm, const Assignment& assignment) {
          try {
            const TrainConfig generation_config = refit_to_shrunk_world(config, assignment);
            DeviceMesh mesh(comm, mesh_shape(generation_config.parallel));
            run_training(generation_config,
                         with_forecast(run, generation_config, plan_cluster, args.plan), mesh,
                         &session);
          } catch (const std::exception& e) {
            session.record_error(e.what());
            throw;
          }
        },
        comm_config);
    return;
  }
  launch_ranks(
      transport, world,
      [&](Communicator& comm) {
        // One rank per process (mpi, gloo): its agent's link and the injected faults.
        std::optional<RankSession> session;
        if (transport != TransportKind::kThreads) session.emplace(comm.rank(), config.elastic);
        try {
          DeviceMesh mesh(comm, shape);
          run_training(config, with_forecast(run, config, plan_cluster, args.plan), mesh,
                       session ? &*session : nullptr);
        } catch (const std::exception& e) {
          if (session) session->record_error(e.what());
          throw;
        }
      },
      comm_config);
}

void add_train_options(CLI::App* cmd, const std::shared_ptr<TrainArgs>& args) {
  cmd->add_option("config", args->config, "The TOML config (see configs/)")->required();
  cmd->add_option("--set", args->overrides, "Override a config key: section.key=value")
      ->allow_extra_args(false);
  cmd->add_option("--metrics", args->run.metrics, "Write one JSON object per step to this file");
  cmd->add_option(
      "--init-from", args->run.init_from,
      "Start from Hugging Face weights of a matching config: a .safetensors file or a model "
      "directory (config.json checked; model.safetensors or the hub's sharded "
      "model.safetensors.index.json)");
  add_layout_flags(*cmd, args->layout);
  cmd->add_option("--resume", args->run.resume,
                  "Continue from a checkpoint directory, or 'auto': the newest valid one under "
                  "output.dir/checkpoints");
  cmd->add_option("--resume-allow-change", args->run.resume_allow_changes,
                  "Resume although this config key differs from the checkpoint's (e.g. "
                  "batch.global_batch: the data stream goes on from the saved position)")
      ->allow_extra_args(false);
  cmd->add_flag("--oversubscribe", args->oversubscribe,
                "Run more in-process ranks than cores (one thread each) to try a large layout on "
                "a small machine; timings then mean nothing");
  cmd->add_flag("--preflight", args->preflight,
                "Run lattice doctor's static checks first and refuse to start when one fails");
  cmd->add_flag("--ckpt-async", args->ckpt_async,
                "Periodic checkpoints: snapshot in memory, write on a background thread while "
                "training continues (output.checkpoint_async)");
  cmd->add_option("--plan", args->plan,
                  "Forecast the run with the planner on this cluster (a preset or a profile "
                  "from lattice bench calibrate) into output.dir/metrics/run.json: lattice report "
                  "draws its memory and step time next to the measured");
  cmd->add_option("--trace", args->run.trace,
                  "Write one Chrome/Perfetto trace per rank into this directory");
}

}  // namespace

void register_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  add_train_options(cmd, args);
  cmd->callback([args, cmd] { run_train(*args, *cmd); });
}

TrainConfig parse_train_command(const std::vector<std::string>& command) {
  CLI::App app;
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train");
  add_train_options(cmd, args);
  std::vector<std::string> reversed(command.rbegin(), command.rend());  // CLI11's order
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    LATTICE_THROW(ConfigError, "the command after `--` ({}): {} ---> HINT: lattice train --help",
                  fmt::join(command, " "), e.what());
  }
  return resolve_train_config(*args, *cmd);
}

}  // namespace lattice::cli
