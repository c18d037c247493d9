// `lattice train CONFIG.toml [--set key=value ...] [--metrics FILE] [--dp N --zero 0|1|2|3 ...]
// [--tp N [--sp]] [--transport threads|mpi|gloo]`: trains with a progress line per step, validation
// every eval.interval steps, a final checkpoint and, if sample.tokens > 0, sampled text at the
// end. The ranks form a dp × tp mesh (tp fastest) on in-process threads or, under mpirun, on MPI
// (docs/data-parallel.md, docs/tensor-parallel.md); every rank evaluates and samples in step,
// world rank 0 alone prints and writes metrics; every rank writes the part of each checkpoint
// it owns and world rank 0 commits it (docs/checkpoints.md; --ckpt-async: in the background).
// The layout comes from the config's [parallel] section; a layout flag given on the command line
// overrides its key.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "ckpt/checkpoint.h"
#include "ckpt/collective_async_saver.h"
#include "ckpt/collective_save.h"
#include "ckpt/trainer_checkpointer.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "comm/launch.h"
#include "core/cpu_peak.h"
#include "core/rank_progress.h"
#include "core/stop_request.h"
#include "core/thread_budget.h"
#include "core/timer.h"
#include "data/tokenizer.h"
#include "elastic/elastic_rank.h"
#include "elastic/rank_session.h"
#include "model/generate.h"
#include "parallel/device_mesh.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/rank_sum.h"
#include "trace/chrome_trace.h"
#include "trace/event_recorder.h"
#include "trace/trace_summary.h"
#include "train/metrics_log.h"
#include "train/trainer.h"

namespace lattice::cli {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string metrics;
  std::string init_from;
  // The layout flags: they override the config's [parallel] keys only when given
  // (apply_layout_flags), so their defaults here are never used.
  ParallelConfig layout;
  std::string trace;           // directory for one Chrome/Perfetto trace per rank; empty: no trace
  std::string resume;          // a checkpoint directory, or "auto": the newest valid under out_dir
  bool ckpt_async = false;     // --ckpt-async (output.checkpoint_async)
  bool oversubscribe = false;  // more in-process ranks than cores: one thread each
  std::vector<std::string> resume_allow_changes;  // --resume-allow-change KEY
};

// The config's [parallel] section with every layout flag given on the command line applied
// over it (CLI11's count() is 0 for a flag left out, whatever its default).
void apply_layout_flags(const CLI::App& cmd, const ParallelConfig& flags, ParallelConfig& layout) {
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  if (given("--dp")) layout.dp = flags.dp;
  if (given("--tp")) layout.tp = flags.tp;
  if (given("--sp")) layout.sequence_parallel = flags.sequence_parallel;
  if (given("--zero")) layout.zero = flags.zero;
  if (given("--bucket-mb")) layout.bucket_mb = flags.bucket_mb;
  if (given("--transport")) layout.transport = flags.transport;
  if (given("--check-replicas")) layout.check_replicas = flags.check_replicas;
  if (given("--deterministic")) layout.deterministic = flags.deterministic;
  if (given("--pp")) layout.pp = flags.pp;
  if (given("--schedule")) layout.schedule = flags.schedule;
  if (given("--virtual-stages")) layout.virtual_stages = flags.virtual_stages;
  if (given("--recompute")) layout.recompute = flags.recompute;
  if (given("--layers-per-chunk")) layout.layers_per_chunk = flags.layers_per_chunk;
}

// The checkpoint a --resume argument names: "auto" is the newest valid step_N under
// out_dir/checkpoints (none: a fresh start), anything else a checkpoint directory.
std::optional<std::filesystem::path> resume_dir(const std::string& resume,
                                                const TrainConfig& config) {
  if (resume.empty()) return std::nullopt;
  if (resume != "auto") return std::filesystem::path(resume);
  if (config.out_dir.empty()) {
    LATTICE_THROW(ConfigError,
                  "--resume auto looks under output.dir, which is empty ---> HINT: set output.dir "
                  "or pass a checkpoint directory to --resume");
  }
  std::optional<ResumeChoice> choice =
      resume_auto(std::filesystem::path(config.out_dir) / "checkpoints");
  if (!choice) return std::nullopt;
  return choice->dir;
}

// The periodic checkpoints of a run (output.checkpoint_every), or nothing. Collective: every
// rank writes what it owns (its stage's layers, its tp shard, its ZeRO range), world rank 0
// commits (ckpt/collective_save.h); asynchronously, the writes go on while training continues
// (ckpt/collective_async_saver.h).
std::optional<TrainerCheckpointer> periodic_checkpoints(Trainer& trainer, const TrainConfig& config,
                                                        DeviceMesh& mesh) {
  if (config.checkpoint_every <= 0 || config.out_dir.empty()) return std::nullopt;
  TrainerCheckpointOptions options{.async = config.checkpoint_async};
  options.commit.keep_last = int(config.keep_last);
  std::optional<TrainerCheckpointer> checkpoints;
  checkpoints.emplace(std::filesystem::path(config.out_dir) / "checkpoints", trainer, mesh.world(),
                      options);
  return checkpoints;
}

// The in-memory snapshots of a rank under `lattice launch`: every elastic.snapshot_every steps
// (0: none)
// into the agent's shared memory, the newest two kept (docs/elastic.md). Asynchronous: the copy
// is taken at the step boundary and written while the next step trains.
std::optional<TrainerCheckpointer> memory_snapshots(Trainer& trainer, const RankSession* session,
                                                    DeviceMesh& mesh) {
  if (session == nullptr || !session->snapshots() || trainer.config().elastic.snapshot_every == 0) {
    return std::nullopt;
  }
  TrainerCheckpointOptions options{.async = true};
  options.commit.keep_last = 2;
  // A rank of a replaced generation never commits into the new one's snapshots (fencing).
  options.commit.fence = [session] { session->check_current(); };
  // A snapshot every rank wrote survives its world's loss: the next generation commits it.
  options.commit.record_writes = true;
  std::optional<TrainerCheckpointer> snapshots;
  snapshots.emplace(*session->snapshots(), trainer, mesh.world(), options);
  return snapshots;
}

// Loads the newest in-memory snapshot of the job, if there is one (a generation after a
// failure); every rank reads its part. Returns whether it did.
bool restore_snapshot(Trainer& trainer, const RankSession* session, Communicator& world) {
  if (session == nullptr || !session->snapshots()) return false;
  const bool lead = world.rank() == 0;
  // The previous world may have lost a rank after every rank had written the snapshot of the
  // step before but before they committed it together: committed now, so that the step lost is
  // only the one in flight. The others wait for the outcome.
  std::string error;
  if (lead) {
    error = capture_error([&] {
      CommitOptions options{.keep_last = 2, .fence = [session] { session->check_current(); }};
      if (const auto dir = commit_written_staging(*session->snapshots(), options)) {
        fmt::print("committed the in-memory snapshot {} that every rank had written\n",
                   dir->filename().string());
      }
    });
  }
  expect_all_succeeded(world, error, "completing the last written snapshot", *session->snapshots(),
                       std::chrono::seconds(60));
  const std::optional<ResumeChoice> choice = resume_auto(*session->snapshots());
  if (!choice) return false;
  report_step(choice->step);
  const PhaseScope recovery(Phase::kRecovery);
  load_trainer_checkpoint(choice->dir, trainer);
  if (lead) {
    fmt::print("restored from the in-memory snapshot of step {} (generation {})\n", choice->step,
               session->generation());
  }
  return true;
}

// Whether any rank was asked to stop (SIGTERM, SIGINT): collective, so every rank stops after
// the same step.
bool stop_agreed(Communicator& world) {
  float flag = stop_requested() != 0 ? 1.0f : 0.0f;
  // A fixed algorithm: the tuner has nothing to learn from one float, and must not re-measure.
  world.all_reduce(&flag, 1, DType::kF32, ReduceOp::kMax, {.algorithm = Algorithm::kTree});
  return flag != 0.0f;
}

// Prints each newly committed checkpoint once (world rank 0).
void report_committed(const TrainerCheckpointer& checkpoints, bool lead,
                      std::optional<std::filesystem::path>& reported) {
  const std::optional<std::filesystem::path>& dir = checkpoints.last_committed();
  if (!lead || !dir || dir == reported) return;
  fmt::print("checkpoint {} committed\n", dir->string());
  reported = dir;
}

void print_summary(Trainer& trainer, const TrainConfig& config, int64_t first_step,
                   double train_seconds, std::optional<double> last_val);

// A stop was requested (preemption): the step just trained is written as a durable checkpoint
// under output.dir/checkpoints, which `--resume auto` continues from.
void save_stop_checkpoint(Trainer& trainer, const TrainConfig& config, DeviceMesh& mesh) {
  const bool lead = mesh.world().rank() == 0;
  if (config.out_dir.empty()) {
    if (lead) {
      spdlog::warn(
          "stop requested (signal {}) after step {}, but output.dir is empty: nothing "
          "was saved ---> HINT: set output.dir to keep a preempted run's progress",
          stop_requested(), trainer.step());
    }
    return;
  }
  const PhaseScope checkpoint(Phase::kCheckpoint);
  const std::filesystem::path dir =
      save_trainer_checkpoint(std::filesystem::path(config.out_dir) / "checkpoints", trainer,
                              &mesh.world(), {.keep_last = int(config.keep_last)});
  if (lead) {
    fmt::print(
        "stopped by signal {} after step {}: checkpoint {} committed (continue with "
        "--resume auto)\n",
        stop_requested(), trainer.step(), dir.string());
    std::fflush(stdout);
  }
}

void print_dp_overlap(const EventRecorder& recorder);

// Every rank's arena peak per category, printed by world rank 0 (collective): what each stage
// and shard really held, to set beside `lattice explain`'s prediction.
void print_memory_peaks(DeviceMesh& mesh, const Arena& arena) {
  const int world = mesh.world().size();
  constexpr MemoryCategory kShown[] = {
      MemoryCategory::kParameters, MemoryCategory::kGradients, MemoryCategory::kOptimizerState,
      MemoryCategory::kActivations, MemoryCategory::kCommunication};
  constexpr size_t kColumns = std::size(kShown) + 1;
  std::vector<double> peaks(size_t(world) * kColumns, 0.0);
  const MemoryStats stats = arena.stats();
  double* mine = peaks.data() + size_t(mesh.world().rank()) * kColumns;
  for (size_t c = 0; c < std::size(kShown); ++c) {
    mine[c] = double(stats.peak_by_category[size_t(kShown[c])]);
  }
  mine[std::size(kShown)] = double(stats.peak_bytes);
  peaks = sum_over_ranks(mesh.world(), peaks);
  if (mesh.world().rank() != 0) return;
  fmt::print(
      "memory peak per rank (MiB): rank (pp, dp, tp) | parameters gradients optimizer "
      "activations communication | total\n");
  for (int r = 0; r < world; ++r) {
    const MeshCoordinates at = mesh_coordinates(mesh.shape(), r);
    const double* row = peaks.data() + size_t(r) * kColumns;
    fmt::print("  {:>3} ({}, {}, {}) | {:10.2f} {:9.2f} {:9.2f} {:11.2f} {:13.2f} | {:.2f}\n", r,
               at.pp, at.dp, at.tp, row[0] / 1048576.0, row[1] / 1048576.0, row[2] / 1048576.0,
               row[3] / 1048576.0, row[4] / 1048576.0, row[5] / 1048576.0);
  }
}

// One rank's training loop on its mesh.
void train_rank(const TrainArgs& args, const TrainConfig& loaded, DeviceMesh& mesh,
                TraceClock::time_point trace_origin, RankSession* session) {
  Stopwatch wall;
  const bool lead = mesh.world().rank() == 0;
  const ParallelConfig& layout = loaded.parallel;
  // --trace: this rank's events (pipeline instructions, steps) on its own recorder.
  EventRecorder recorder(mesh.world().rank(), trace_origin, !args.trace.empty());
  ScopedCurrentRecorder current_recorder(args.trace.empty() ? nullptr : &recorder);
  Arena arena(fmt::format("rank{}", mesh.world().rank()));
  ParallelSetup parallel{.dp = &mesh.dp(),
                         .zero = layout.zero,
                         .bucket_bytes = int64_t(layout.bucket_mb * double(1 << 20)),
                         .check_replicas = layout.check_replicas,
                         .tp = &mesh.tp(),
                         .sequence_parallel = layout.sequence_parallel,
                         .pp = &mesh.pp(),
                         .embedding = mesh.embedding(),
                         .schedule = parse_schedule_kind(layout.schedule),
                         .virtual_stages = layout.virtual_stages,
                         .layers_per_chunk = layout.layers_per_chunk,
                         .recompute = parse_recompute(layout.recompute)};
  Trainer trainer(loaded, arena, parallel);
  const TrainConfig& config = trainer.config();  // with the batch resolved
  if (!args.init_from.empty()) {
    load_hf_weights(args.init_from, trainer.model());
    if (lead) fmt::print("initialised from {}\n", args.init_from);
  }

  // Under an agent that restarted the job, the newest in-memory snapshot comes before --resume.
  if (!restore_snapshot(trainer, session, mesh.world())) {
    if (std::optional<std::filesystem::path> dir = resume_dir(args.resume, config)) {
      // Each rank reads its shard; a change of what the math depends on is refused.
      TrainingState state =
          load_trainer_checkpoint(*dir, trainer, {.allow_changes = args.resume_allow_changes});
      if (lead) fmt::print("resumed from {} at step {}\n", dir->string(), state.step);
    } else if (lead && !args.resume.empty()) {
      fmt::print("no checkpoint to resume from: starting at step 0\n");
    }
  }

  const int threads = thread_budget();
  const int world = mesh.world().size();
  const double peak = measured_fp32_peak_flops_per_thread() * threads * world;
  if (lead) {
    fmt::print(
        "lattice train: {} ({} parameters) | {} | global batch {} = {} x {} micro-batches x dp {} "
        "of T={} ({} tokens) | {} steps | mesh {} on {}: {} rank(s) x {} thread(s){}{}{}{}, "
        "fp32 peak {:.1f} GFLOP/s\n",
        config.model.name, trainer.model().registry().global_elements(),
        config.compute_dtype == DType::kBF16 ? "bf16 compute, fp32 master" : "fp32",
        config.global_batch, config.micro_batch, config.micro_batches, layout.dp, config.seq_len,
        config.tokens_per_step(), config.steps, mesh.shape().to_string(), layout.transport, world,
        threads,
        layout.dp > 1 ? fmt::format(", zero {}, buckets of {} MB", layout.zero, layout.bucket_mb)
                      : "",
        layout.tp > 1 ? fmt::format(", tensor parallel{}",
                                    layout.sequence_parallel ? " + sequence parallel" : "")
                      : "",
        layout.pp > 1 ? fmt::format(", pipeline {} (v={})", layout.schedule, layout.virtual_stages)
                      : "",
        layout.recompute != "none" ? fmt::format(", recompute {}", layout.recompute) : "",
        peak / 1e9);
  }

  if (lead && world > 1) {
    fmt::print("collectives: {}\n",
               layout.deterministic
                   ? std::string("ring everywhere (parallel.deterministic: bitwise repeatable)")
                   : fmt::format("the cheapest algorithm per message size under {}; a size "
                                 "running {}x slower than predicted is re-measured and switched "
                                 "at the next step boundary",
                                 layout.comm_profile.empty()
                                     ? std::string("the analytic cost model")
                                     : fmt::format("the profile {}", layout.comm_profile),
                                 Tuner::kSlowdownThreshold));
  }
  std::optional<MetricsLog> metrics;
  if (lead && !args.metrics.empty()) metrics.emplace(args.metrics, trainer.step());
  std::optional<double> last_val;
  std::optional<TrainerCheckpointer> checkpoints = periodic_checkpoints(trainer, config, mesh);
  std::optional<TrainerCheckpointer> snapshots = memory_snapshots(trainer, session, mesh);
  // The snapshot of step N is written by the time step N+1's backward starts: a fault from
  // there on restores step N (at most the step in flight lost). Its forward overlaps the write.
  if (snapshots) trainer.set_before_backward([&snapshots] { snapshots->wait_written(); });
  std::optional<std::filesystem::path> reported;
  double stall_seconds = 0.0;
  int64_t saves = 0;
  bool stopped = false;
  const int64_t first_step = trainer.step();
  for (int64_t s = first_step; s < config.steps; ++s) {
    StepMetrics m = trainer.train_step();
    if (checkpoints) checkpoints->after_step();  // an async save commits once all ranks wrote
    if (snapshots) {
      const PhaseScope snapshot(Phase::kSnapshot);
      snapshots->after_step();
      if (m.step % config.elastic.snapshot_every == 0) snapshots->save();
    }
    const bool last = m.step == config.steps;
    const bool eval_due =
        trainer.has_validation() &&
        ((config.eval_interval > 0 && m.step % config.eval_interval == 0) || last);
    // Every replica evaluates (they hold the same weights), so no rank idles in the next step's
    // collectives for the length of an evaluation, however long it takes.
    if (eval_due) last_val = m.val_loss = trainer.evaluate();
    if (checkpoints && m.step % config.checkpoint_every == 0 && !last) {
      stall_seconds += checkpoints->save();
      ++saves;
    }
    if (checkpoints) report_committed(*checkpoints, lead, reported);
    stopped = !last && stop_agreed(mesh.world());
    if (lead) {
      if (m.step % config.log_interval == 0 || eval_due || last || m.step == 1 || stopped) {
        fmt::print("{}\n", format_progress(m, config.steps, peak));
        std::fflush(stdout);
      }
      if (metrics) metrics->write(m, peak);
    }
    if (stopped) break;
  }
  report_phase(Phase::kFinishing);
  if (snapshots) snapshots->finish();
  trainer.set_before_backward({});
  if (checkpoints) {
    checkpoints->finish();  // the last asynchronous save committed, or its error on every rank
    report_committed(*checkpoints, lead, reported);
    if (lead && saves > 0) {
      fmt::print("periodic checkpoints: {} save(s){}, training stalled {:.1f} ms per save\n", saves,
                 checkpoints->async() ? " (asynchronous)" : "",
                 1e3 * stall_seconds / double(saves));
    }
  }
  if (stopped) {
    save_stop_checkpoint(trainer, config, mesh);
    return;
  }
  const double train_seconds = wall.seconds();
  print_memory_peaks(mesh, arena);
  if (!config.out_dir.empty()) {
    const std::filesystem::path dir = std::filesystem::path(config.out_dir) / "final";
    save_trainer_checkpoint_dir(dir, trainer, &mesh.world());  // every rank writes its part
    if (lead) fmt::print("checkpoint written to {}\n", dir.string());
  }
  if (!args.trace.empty()) {
    const std::filesystem::path file = write_chrome_trace_to_dir(args.trace, recorder);
    if (lead) fmt::print("trace of rank 0 written to {} (one file per rank)\n", file.string());
    if (lead && layout.dp > 1) print_dp_overlap(recorder);
  }
  // Every tp rank takes part in sampling (the logits are split by vocabulary); dp replicas other
  // than the first do not. A pipeline stage holds only some layers: no sampling there.
  if (config.sample_tokens > 0 && layout.pp > 1 && lead) {
    fmt::print("sampling skipped: with --pp {} no rank holds the whole model\n", layout.pp);
  }
  // Under ZeRO-3 the layers are gathered from every dp rank, so all of them sample (the same
  // tokens: same weights, prompt and seed).
  const bool samples = mesh.coordinates().dp == 0 || (layout.zero >= 3 && layout.dp > 1);
  if (config.sample_tokens > 0 && layout.pp == 1 && samples) {
    auto tokenizer = make_tokenizer(config.tokenizer);
    SampleOptions options{config.sample_tokens, config.sample_temperature, config.sample_seed};
    std::vector<int32_t> tokens =
        generate(trainer.model(), tokenizer->encode(config.sample_prompt), options);
    if (lead) {
      print_summary(trainer, config, first_step, train_seconds, last_val);
      fmt::print("---- sample ({} tokens, temperature {}) ----\n{}\n--------\n",
                 config.sample_tokens, config.sample_temperature, tokenizer->decode(tokens));
    }
  } else if (lead) {
    print_summary(trainer, config, first_step, train_seconds, last_val);
  }
}

// The share of the data-parallel communication (the comm thread's "dp ..." events: bucket
// reductions, ZeRO-3 gathers) during which the rank also computed, from its trace.
void print_dp_overlap(const EventRecorder& recorder) {
  std::vector<TraceEvent> dp_and_compute;
  for (TraceEvent& event : recorder.events()) {
    if (event.category == TraceCategory::kCompute || event.name.starts_with("dp ")) {
      dp_and_compute.push_back(std::move(event));
    }
  }
  const RankTraceSummary summary = summarize_rank_trace(recorder.rank(), dp_and_compute);
  fmt::print(
      "data-parallel communication (rank 0, from the trace): {:.1f} ms, {:.0f}% of it hidden "
      "behind forward/backward\n",
      double(summary.busy(TraceCategory::kCollective)) / 1e6,
      100.0 * summary.collective_hidden_fraction());
}

void print_summary(Trainer& trainer, const TrainConfig& config, int64_t first_step,
                   double train_seconds, std::optional<double> last_val) {
  fmt::print("trained {} steps in {:.1f} s", config.steps - first_step, train_seconds);
  if (last_val) fmt::print(" | final validation loss {:.4f}", *last_val);
  fmt::print("\n");
  const GradientSyncStats sync = trainer.gradient_sync_stats();
  const double steps = double(std::max<int64_t>(1, config.steps - first_step));
  if (sync.buckets > 0 && sync.zero < 2) {
    fmt::print(
        "gradient reduction (rank 0): {} buckets, {:.2f} ms/step on the comm thread, {:.2f} "
        "ms/step exposed after backward ({:.0f}% hidden)\n",
        sync.buckets, 1e3 * sync.communication_seconds / steps, 1e3 * sync.exposed_seconds / steps,
        sync.communication_seconds > 0
            ? 100.0 * std::max(0.0, 1.0 - sync.exposed_seconds / sync.communication_seconds)
            : 0.0);
  }
  if (sync.buckets > 0 && sync.zero >= 2) {
    fmt::print(
        "ZeRO-{} gradient reduction to the owners (rank 0): {} buckets, at most {} lent at once, "
        "{:.2f} ms/step on the comm thread, {:.2f} ms/step exposed after backward\n",
        sync.zero, sync.buckets, sync.peak_lent, 1e3 * sync.communication_seconds / steps,
        1e3 * sync.exposed_seconds / steps);
  }
  if (sync.zero == 3 && sync.buckets > 0) {
    fmt::print(
        "ZeRO-3 parameter gathers (rank 0): {:.2f} ms/step on the comm thread, at most "
        "{:.2f} MiB of parameters gathered at once\n",
        1e3 * sync.gather_seconds / steps,
        double(sync.peak_gathered_elements) * 4 / double(1 << 20));
  }
}

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
        "world of {} ranks: dp {} -> {}, micro-batch {} x {} -> {} x {} per rank, global batch {} "
        "kept\n",
        assignment.world, before.parallel.dp, refit.parallel.dp, before.micro_batch,
        before.micro_batches, refit.micro_batch, refit.micro_batches, refit.global_batch);
  }
  return refit;
}

MeshShape mesh_shape(const ParallelConfig& layout) {
  return {.pp = layout.pp, .dp = layout.dp, .tp = layout.tp};
}

void run_train(const TrainArgs& args, const CLI::App& cmd) {
  TrainConfig config = load_train_config(args.config, args.overrides);
  apply_layout_flags(cmd, args.layout, config.parallel);
  if (cmd.count("--ckpt-async") > 0) config.checkpoint_async = args.ckpt_async;
  const TransportKind transport = parse_transport(config.parallel.transport);
  const ParallelConfig& layout = config.parallel;
  const MeshShape shape = mesh_shape(layout);
  // Everything that can be checked before a rank starts is checked here, once.
  validate_tensor_parallel(config.model, {layout.tp, 0, layout.sequence_parallel});
  const int cores = available_cores();
  const int world = shape.world_size();
  if (transport == TransportKind::kThreads && world * std::max(1, config.threads) > cores) {
    if (!args.oversubscribe) {
      LATTICE_THROW(ConfigError,
                    "{} in-process ranks (dp {} x tp {} x pp {}) with train.threads = {} need {} "
                    "cores but {} are available ---> HINT: ranks x threads must not exceed the "
                    "cores; lower --dp, --tp, --pp (parallel.dp, .tp, .pp) or train.threads, run "
                    "under mpirun with --transport mpi, or pass --oversubscribe to try the "
                    "layout anyway (one thread per rank; the results are exact, the timings are "
                    "not)",
                    world, layout.dp, layout.tp, layout.pp, config.threads,
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
  install_stop_request_handlers();  // SIGTERM: finish the step, checkpoint, exit 0
  const TraceClock::time_point trace_origin = TraceClock::now();  // shared by this process's ranks
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
            train_rank(args, generation_config, mesh, trace_origin, &session);
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
          train_rank(args, config, mesh, trace_origin, session ? &*session : nullptr);
        } catch (const std::exception& e) {
          if (session) session->record_error(e.what());
          throw;
        }
      },
      comm_config);
}

}  // namespace

void register_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  cmd->add_option("config", args->config, "The TOML config (see configs/)")->required();
  cmd->add_option("--set", args->overrides, "Override a config key: section.key=value")
      ->allow_extra_args(false);
  cmd->add_option("--metrics", args->metrics, "Write one JSON object per step to this file");
  cmd->add_option(
      "--init-from", args->init_from,
      "Start from Hugging Face weights of a matching config: a .safetensors file or a model "
      "directory (config.json checked; model.safetensors or the hub's sharded "
      "model.safetensors.index.json)");
  // The layout flags override the config's [parallel] keys of the same names when given.
  ParallelConfig& layout = args->layout;
  cmd->add_option("--dp", layout.dp, "Data-parallel ranks (parallel.dp)")->check(positive_number());
  cmd->add_option("--tp", layout.tp,
                  "Tensor-parallel ranks: heads, d_ff and vocabulary split (parallel.tp)")
      ->check(positive_number());
  cmd->add_flag("--sp", layout.sequence_parallel,
                "Sequence parallelism: split the residual stream's token rows over the tp group "
                "(parallel.sp; --sp=false turns it off)");
  cmd->add_option("--transport", layout.transport,
                  "threads (in-process ranks) or mpi (one rank per process, under mpirun) "
                  "(parallel.transport)");
  cmd->add_option(
         "--zero", layout.zero,
         "ZeRO stage: 0 replicated, 1 optimizer state sharded over dp, 2 and gradients, 3 and "
         "parameters (parallel.zero)")
      ->check(CLI::Range(0, 3));
  cmd->add_option("--bucket-mb", layout.bucket_mb,
                  "Gradient bucket size in MB, dp > 1 (parallel.bucket_mb)")
      ->check(positive_number());
  cmd->add_option("--resume", args->resume,
                  "Continue from a checkpoint directory, or 'auto': the newest valid one under "
                  "output.dir/checkpoints");
  cmd->add_option("--resume-allow-change", args->resume_allow_changes,
                  "Resume although this config key differs from the checkpoint's (e.g. "
                  "batch.global_batch: the data stream goes on from the saved position)")
      ->allow_extra_args(false);
  cmd->add_flag("--oversubscribe", args->oversubscribe,
                "Run more in-process ranks than cores (one thread each) to try a large layout on "
                "a small machine; timings then mean nothing");
  cmd->add_flag("--ckpt-async", args->ckpt_async,
                "Periodic checkpoints: snapshot in memory, write on a background thread while "
                "training continues (output.checkpoint_async)");
  cmd->add_option("--pp", layout.pp, "Pipeline stages (parallel.pp)")->check(positive_number());
  cmd->add_option("--schedule", layout.schedule,
                  "Pipeline schedule: gpipe, 1f1b, interleaved-1f1b, zb-h1 (parallel.schedule)");
  cmd->add_option("--virtual-stages", layout.virtual_stages,
                  "Model chunks per pipeline stage, for interleaved-1f1b (parallel.virtual_stages)")
      ->check(positive_number());
  cmd->add_option("--layers-per-chunk", layout.layers_per_chunk,
                  "Pipeline chunks' layer counts in model order, e.g. 3,5 (default: balanced by "
                  "the cost model; parallel.layers_per_chunk)")
      ->delimiter(',');
  cmd->add_option("--recompute", layout.recompute,
                  "Activation recompute: none, selective, full (parallel.recompute)");
  cmd->add_option("--trace", args->trace,
                  "Write one Chrome/Perfetto trace per rank into this directory");
  cmd->add_flag("--deterministic", layout.deterministic,
                "Pin every collective to ring, never re-tuned: runs of one layout agree bit for "
                "bit (parallel.deterministic; default: the tuner's choice per message size)");
  cmd->add_flag("--check-replicas", layout.check_replicas,
                "After every step, check that all dp replicas hold identical parameters "
                "(parallel.check_replicas)");
  cmd->callback([args, cmd] { run_train(*args, *cmd); });
}

}  // namespace lattice::cli
