// `lattice doctor CONFIG [--set key=value ...] [layout flags] [--resume DIR] [--no-probe]
// [--probe-steps N] [--json] [--oversubscribe]`, or `mpirun -np N lattice doctor --env
// [--threads T]`: the checks of doctor/doctor.h on the config as
// `lattice train` would run it (the same layout flags), after a probe of a few real steps of the
// layout on a slice of the model (doctor/probe.h). Text by default, one JSON object per check with
// --json; exit code 1 when a check fails.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>

#include "ckpt/checkpoint.h"
#include "ckpt/collective_save.h"
#include "cli/commands.h"
#include "cli/layout_flags.h"
#include "cli/validators.h"
#include "comm/launch.h"
#include "comm/launch_env.h"
#include "core/error.h"
#include "doctor/doctor.h"
#include "doctor/rank_environment.h"
#include "doctor/run_checks.h"
#include "elastic/agent.h"
#include "elastic/elastic_rank.h"
#include "elastic/rank_session.h"

namespace lattice::cli {

namespace {

struct DoctorArgs {
  bool env = false;  // --env: the launch environment of every rank instead of a config
  int threads = 0;   // --env: each rank's thread budget (train.threads; 0: its cores)
  std::string config;
  std::vector<std::string> overrides;
  LayoutFlags layout;
  std::string resume;
  std::string ckpt;  // --ckpt DIR: a checkpoint on its own, or against CONFIG
  std::string run;   // --run DIR: a run's per-rank metrics
  std::string init_from;
  bool no_probe = false;
  int probe_steps = 3;
  bool json = false;
  bool oversubscribe = false;
};

std::string layout_line(const ParallelConfig& p) {
  return fmt::format(
      "dp {} × tp {}{} × pp {}{}, ZeRO-{}, recompute {}", p.dp, p.tp,
      p.sequence_parallel ? " (sp)" : "", p.pp,
      p.pp > 1 ? fmt::format(" ({}, v {})", schedule_kind_name(p.schedule), p.virtual_stages) : "",
      p.zero, recompute_name(p.recompute));
}

void print_results(const std::vector<doctor::CheckResult>& results, bool json) {
  if (json) {
    for (const doctor::CheckResult& r : results) fmt::print("{}\n", doctor::to_json(r).dump());
    return;
  }
  fmt::print("{}", doctor::format_results(results));
  int counts[4] = {0, 0, 0, 0};
  for (const doctor::CheckResult& r : results) ++counts[int(r.verdict)];
  fmt::print("\n{} passed, {} warned, {} failed, {} not applicable\n", counts[0], counts[1],
             counts[2], counts[3]);
}

// --env: every rank (one process each under mpirun, srun or lattice launch, else this process
// alone) reports what it sees of its launch; rank 0 prints the checks of all of them.
void run_environment_doctor(const DoctorArgs& args) {
  const std::optional<LaunchEnvironment> launch = detect_launch_environment();
  const bool elastic = detect_agent_link().has_value();
  const std::string launched_by = elastic  ? std::string("launched by lattice launch")
                                  : launch ? "launched by " + launch->launcher
                                           : std::string("started by hand");
  int failed = 0;
  auto print_environment = [&](const std::vector<doctor::RankEnvironment>& ranks,
                               const std::vector<doctor::CheckResult>& results) {
    if (!args.json) {
      fmt::print("lattice doctor --env: {} rank(s), {}\n\n", ranks.size(), launched_by);
      for (const doctor::RankEnvironment& e : ranks) {
        fmt::print(
            "rank {} on {}: launcher rank {}, local rank {}; {} core(s), {} NUMA node(s), "
            "{} thread(s)\n",
            e.rank, e.host, e.launcher ? std::to_string(e.launcher->rank) : "-",
            e.launcher ? std::to_string(e.launcher->local_rank) : "-", e.cpus.size(),
            e.numa_nodes_spanned, e.threads);
      }
      fmt::print("\n");
    }
    print_results(results, args.json);
    std::fflush(stdout);
  };
  auto report = [&](Communicator& world) {
    const doctor::RankEnvironment mine =
        doctor::observe_rank_environment(world.rank(), world.size(), args.threads);
    std::vector<doctor::RankEnvironment> ranks;
    for (const std::string& text :
         all_gather_strings(world, doctor::to_json(mine).dump(), std::chrono::seconds(30))) {
      ranks.push_back(doctor::rank_environment_from_json(nlohmann::json::parse(text)));
    }
    const std::vector<doctor::CheckResult> results = doctor::check_rank_environments(ranks);
    failed = doctor::failed_count(results);
    if (world.rank() == 0) print_environment(ranks, results);
    // The others wait until rank 0 has printed: one that exited first with the failure's code
    // would have its launcher end the job while rank 0 was still writing the report.
    world.barrier();
  };
  if (elastic) {
    // A rank process of `lattice launch`: the first generation's Gloo world reports.
    RankSession session(0, ElasticConfig{});
    CommConfig comm;
    comm.timeout = std::chrono::seconds(30);
    run_elastic_rank(
        session, [&](Communicator& world, const Assignment&) { report(world); }, comm);
    std::fflush(stdout);
    // A finding, not a fault: the agent ends the job instead of restarting the rank.
    if (failed > 0) std::exit(kInvalidInputExitCode);
    return;
  }
  const TransportKind transport = launch ? TransportKind::kMpi : TransportKind::kThreads;
  launch_ranks(transport, launch ? launch->size : 1, report);
  std::fflush(stdout);
  if (failed > 0) std::exit(1);
}

// --ckpt DIR without a config: the checkpoint against the model it records.
void run_checkpoint_doctor(const DoctorArgs& args) {
  doctor::DoctorInput input;
  const CheckpointInfo info = read_checkpoint_info(args.ckpt);
  input.config.model = info.model;
  input.config.compute_dtype = info.compute_dtype;
  input.resume_from = args.ckpt;
  std::vector<doctor::CheckResult> results;
  for (const doctor::DoctorCheck& check : doctor::doctor_checks()) {
    if (check.id != "checkpoint") continue;
    doctor::CheckResult result = check.run(input);
    result.id = check.id;
    result.title = check.title;
    results.push_back(std::move(result));
  }
  if (!args.json) {
    fmt::print(
        "lattice doctor --ckpt {}: model '{}' as recorded (pass a CONFIG to check it "
        "against a run)\n\n",
        args.ckpt, info.model.name);
  }
  print_results(results, args.json);
  std::fflush(stdout);
  if (doctor::failed_count(results) > 0) std::exit(1);
}

void run_doctor(const DoctorArgs& args, const CLI::App& cmd) {
  if (args.env) {
    run_environment_doctor(args);
    return;
  }
  if (!args.run.empty()) {
    const std::vector<doctor::CheckResult> results = doctor::check_run(read_run_metrics(args.run));
    if (!args.json) fmt::print("lattice doctor --run {}\n\n", args.run);
    print_results(results, args.json);
    std::fflush(stdout);
    if (doctor::failed_count(results) > 0) std::exit(1);
    return;
  }
  if (!args.ckpt.empty() && args.config.empty()) {
    run_checkpoint_doctor(args);
    return;
  }
  if (args.config.empty()) {
    LATTICE_THROW(ConfigError,
                  "lattice doctor needs a config ---> HINT: lattice doctor "
                  "configs/gpt2-tiny.toml [layout flags], --ckpt DIR, or --env under the "
                  "launcher");
  }
  doctor::DoctorInput input;
  input.config = resolve_layout_config(args.config, args.overrides, cmd, args.layout);
  input.machine = doctor::observe_machine();
  input.gemm_libraries = doctor::time_gemm_libraries(input.config, input.machine);
  input.oversubscribe = args.oversubscribe;
  if (!args.resume.empty()) input.resume_from = args.resume;
  if (!args.ckpt.empty()) input.resume_from = args.ckpt;
  if (!args.init_from.empty()) input.init_from = args.init_from;

  std::vector<doctor::CheckResult> results;
  std::string probe_line = "probe: not run (--no-probe)";
  if (!args.no_probe) {
    try {
      const std::map<std::string, int64_t> waits = doctor::read_port_xmit_wait();
      const std::map<std::string, int64_t> pauses = doctor::read_pause_frames();
      input.probe = doctor::run_probe(input.config, {.steps = args.probe_steps});
      input.port_xmit_wait_during_probe =
          doctor::counter_deltas(waits, doctor::read_port_xmit_wait());
      input.pause_frames_during_probe = doctor::counter_deltas(pauses, doctor::read_pause_frames());
      const TrainConfig& slice = input.probe->config;
      probe_line = fmt::format(
          "probe: {} steps of {} layers, {} tokens per sequence, {} sequences per step, in {:.2f} "
          "s",
          args.probe_steps, slice.model.n_layer, slice.seq_len, slice.global_batch,
          input.probe->seconds);
    } catch (const std::exception& e) {
      // A layout the probe cannot run (or a hang it timed out on) is itself the finding.
      doctor::CheckResult failed{.id = "probe",
                                 .title = "Probe of the layout",
                                 .verdict = doctor::Verdict::kFail,
                                 .saw = e.what(),
                                 .fix = "the checks below name what the layout needs"};
      results.push_back(failed);
      probe_line = "probe: failed";
    }
  }
  for (doctor::CheckResult& r : doctor::run_checks(input)) results.push_back(std::move(r));

  if (!args.json) {
    fmt::print("lattice doctor: {} ({}), {}\n{}\n\n", args.config, input.config.model.name,
               layout_line(input.config.parallel), probe_line);
  }
  print_results(results, args.json);
  std::fflush(stdout);
  if (doctor::failed_count(results) > 0) std::exit(1);
}

}  // namespace

void register_doctor_command(CLI::App& app) {
  auto args = std::make_shared<DoctorArgs>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "Check a config, its layout and this machine for the classic failure modes");
  cmd->add_option("config", args->config, "The train TOML config (see configs/)");
  cmd->add_flag("--env", args->env,
                "The launch environment instead of a config: run under mpirun or srun, each rank "
                "reports (launcher's rank, cores, NUMA, devices) and rank 0 checks them all");
  cmd->add_option("--threads", args->threads,
                  "--env: each rank's thread budget to check its cores against (train.threads)")
      ->check(non_negative_number());
  cmd->add_option("--set", args->overrides, "Override a config key: section.key=value")
      ->allow_extra_args(false);
  add_layout_flags(*cmd, args->layout);
  cmd->add_option("--resume", args->resume,
                  "The checkpoint directory the run would resume from: compared with the config");
  cmd->add_option("--ckpt", args->ckpt,
                  "A checkpoint directory to check: against CONFIG when one is given (with every "
                  "other check), else against the model it records");
  cmd->add_option("--run", args->run,
                  "A run's output.dir: its per-rank metrics (losses, stragglers, memory, "
                  "exposed communication) instead of a config");
  cmd->add_option("--init-from", args->init_from,
                  "Hugging Face weights the run would start from (a .safetensors file or a model "
                  "directory): every tensor checked against the model");
  cmd->add_flag("--no-probe", args->no_probe,
                "Static checks only: no probe steps (the checks that need them say N/A)");
  cmd->add_option("--probe-steps", args->probe_steps, "Steps of the probe")
      ->check(positive_number());
  cmd->add_flag("--json", args->json, "One JSON object per check on stdout");
  cmd->add_flag("--oversubscribe", args->oversubscribe,
                "The run will pass --oversubscribe to lattice train (more in-process ranks than "
                "cores): a warning instead of a failure");
  cmd->callback([args, cmd] { run_doctor(*args, *cmd); });
}

}  // namespace lattice::cli
