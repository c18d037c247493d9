#include "run/training_run.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>

#include "ckpt/checkpoint.h"
#include "ckpt/collective_async_saver.h"
#include "ckpt/collective_save.h"
#include "ckpt/hf_format.h"
#include "ckpt/snapshot_slots.h"
#include "ckpt/trainer_checkpoint.h"
#include "ckpt/trainer_checkpointer.h"
#include "comm/tuner.h"
#include "core/cpu_peak.h"
#include "core/rank_progress.h"
#include "core/stop_request.h"
#include "core/thread_budget.h"
#include "core/timer.h"
#include "data/tokenizer.h"
#include "kernels/matmul.h"
#include "model/generate.h"
#include "parallel/rank_sum.h"
#include "run/live_progress.h"
#include "run/rank_metrics.h"
#include "trace/chrome_trace.h"
#include "trace/event_recorder.h"
#include "trace/trace_summary.h"
#include "train/metrics_log.h"
#include "train/trainer.h"

namespace lattice {
namespace {

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
// (0: none) into the agent's shared memory (docs/elastic.md). Each rank writes its shard at the
// step boundary. On one node into one of its two slots, and nothing more; over several nodes as
// a checkpoint directory, whose replica on the next node and commit follow while the next step
// trains.
std::optional<TrainerCheckpointer> memory_snapshots(Trainer& trainer, const RankSession* session,
                                                    DeviceMesh& mesh,
                                                    std::optional<PhaseScope>& snapshot_phase) {
  if (session == nullptr || !session->snapshots() || trainer.config().elastic.snapshot_every == 0) {
    return std::nullopt;
  }
  TrainerCheckpointOptions options{.async = true};
  options.commit.keep_last = 2;
  // A rank of a replaced generation never commits into the new one's snapshots (fencing).
  options.commit.fence = [session] { session->check_current(); };
  // A snapshot every rank wrote survives its world's loss: the next generation commits it.
  if (session->replication() == nullptr) {
    options.slots_of_generation = session->generation();
    // The snapshot phase begins once the slot is torn: a fault injected there (kill@snapshot)
    // finds a copy that must never be restored.
    options.while_slot_torn = [&snapshot_phase] { snapshot_phase.emplace(Phase::kSnapshot); };
    std::optional<TrainerCheckpointer> snapshots;
    snapshots.emplace(*session->snapshots(), trainer, mesh.world(), options);
    return snapshots;
  }
  options.commit.record_writes = true;
  options.commit.write_phase = Phase::kSnapshot;
  // Written before the next step starts: a fault anywhere in it restores this step.
  options.commit.write_at_save = true;
  // The pruned snapshots' pages in shared memory are written over, not freed and allocated anew.
  options.commit.recycle_pruned = true;
  // Several nodes: each writes its own copy, holding the previous node's shards too.
  if (const SnapshotReplicator* replication = session->replication()) {
    options.commit.node_of_rank = replication->node_of_rank();
    options.commit.replicate = [replication](const std::filesystem::path& staging, int rank) {
      replication->replicate(staging, rank);
    };
    options.commit.kept_ranks = replication->kept_with(mesh.world().rank());
  }
  std::optional<TrainerCheckpointer> snapshots;
  snapshots.emplace(*session->snapshots(), trainer, mesh.world(), options);
  return snapshots;
}

// Several nodes: every rank restores the same step, the oldest of the newest each node's copy
// holds (a node whose replication of the newest did not finish has the one before). A node
// whose copy lacks it cannot restore (docs/elastic.md, what survives which fault).
std::optional<ResumeChoice> agree_on_snapshot(Communicator& world,
                                              const std::filesystem::path& root,
                                              const std::optional<ResumeChoice>& mine) {
  // Steps fit 32 bits (a billion steps is beyond any run).
  const int32_t step = mine ? int32_t(mine->step) : -1;
  std::vector<int32_t> steps(size_t(world.size()));
  world.all_gather(&step, steps.data(), 1, DType::kI32, {.algorithm = Algorithm::kRing});
  const int64_t newest = *std::max_element(steps.begin(), steps.end());
  if (newest < 0) return std::nullopt;
  const int64_t agreed = *std::min_element(steps.begin(), steps.end());
  const std::filesystem::path dir = CheckpointRoot(root).step_dir(agreed);
  std::string error;
  if (agreed < 0 || !std::filesystem::exists(dir)) {
    error = fmt::format(
        "rank {}: this node's copy of the in-memory snapshots lacks step {} (the others hold "
        "up to step {}) ---> HINT: two neighbouring nodes lost (each node's copy is kept on "
        "the next one only) cannot be restored from memory; resume from a durable checkpoint "
        "(--resume auto)",
        world.rank(), std::max<int64_t>(agreed, 0), newest);
  }
  expect_all_succeeded(world, error, "agreeing on the snapshot to restore", root,
                       std::chrono::seconds(60));
  return ResumeChoice{.dir = dir, .step = agreed, .skipped = {}};
}

// Loads the newest in-memory snapshot of the job, if there is one (a generation after a
// failure); every rank reads its part. Returns whether it did.
bool restore_snapshot(Trainer& trainer, const RankSession* session, Communicator& world) {
  if (session == nullptr || !session->snapshots()) return false;
  // One node: rank 0 commits the shared copy. Several: each node's first rank its node's copy.
  const SnapshotReplicator* replication = session->replication();
  bool lead = world.rank() == 0;
  if (replication != nullptr) {
    const std::vector<int>& nodes = replication->node_of_rank();
    lead = std::find(nodes.begin(), nodes.end(), nodes[size_t(world.rank())]) - nodes.begin() ==
           world.rank();
  }
  // Several nodes: each copy holds its node's shards and the previous node's; each is first
  // filled from the others, so that every node restores (or commits) the same whole snapshot.
  if (replication != nullptr) replication->fill(*session->snapshots(), world);
  // The previous world may have lost a rank after every rank had written the snapshot of the
  // step before but before they committed it together: committed now, so that the step lost is
  // only the one in flight. The others wait for the outcome.
  std::string error;
  if (lead) {
    error = capture_error([&] {
      CommitOptions options{.keep_last = 2, .fence = [session] { session->check_current(); }};
      std::optional<std::filesystem::path> dir =
          replication != nullptr ? commit_written_staging(*session->snapshots(), options)
                                 : commit_slot_snapshot(*session->snapshots(), options);
      if (dir) {
        fmt::print("committed the in-memory snapshot {} that every rank had written\n",
                   dir->filename().string());
      }
      remove_staging(*session->snapshots());
      remove_slots(*session->snapshots());
    });
  }
  expect_all_succeeded(world, error, "completing the last written snapshot", *session->snapshots(),
                       std::chrono::seconds(60));
  std::optional<ResumeChoice> choice;
  try {
    choice = resume_auto(*session->snapshots());
  } catch (const IoError& e) {
    if (replication == nullptr) throw;
    LATTICE_THROW(IoError,
                  "rank {}: this node's copy of the in-memory snapshots is not whole even after "
                  "filling it from the other nodes ({}) ---> HINT: two neighbouring nodes lost "
                  "(each node's shards are kept on the next one only) cannot be restored from "
                  "memory; resume from a durable checkpoint (--resume auto)",
                  world.rank(), e.what());
  }
  if (replication != nullptr) choice = agree_on_snapshot(world, *session->snapshots(), choice);
  if (!choice) return false;
  report_step(choice->step);
  const PhaseScope recovery(Phase::kRecovery);
  load_trainer_checkpoint(choice->dir, trainer);
  if (world.rank() == 0) {
    fmt::print("restored from the in-memory snapshot of step {} (generation {})\n", choice->step,
               session->generation());
  }
  return true;
}

// A stop every rank agreed on: the signal and the rank that received it (the lowest, when
// several did), so that rank 0 names a signal sent to another rank's process.
struct AgreedStop {
  int signal = 0;
  int rank = 0;
  int ranks_signalled = 0;
};

// Whether any rank was asked to stop (SIGTERM, SIGINT): collective, so every rank stops after
// the same step.
std::optional<AgreedStop> stop_agreed(Communicator& world) {
  // One float, exact below 2^24: the signal in the high part, 4095 - rank in the low 12 bits,
  // so that the maximum is the highest signal at the lowest rank.
  constexpr int kRankSpan = 4096;
  const int signal = stop_requested();
  const int rank_code = kRankSpan - 1 - std::min(world.rank(), kRankSpan - 1);
  float code = signal != 0 ? float(signal * kRankSpan + rank_code) : 0.0f;
  // A fixed algorithm: the tuner has nothing to learn from one float, and must not re-measure.
  world.all_reduce(&code, 1, DType::kF32, ReduceOp::kMax, {.algorithm = Algorithm::kTree});
  if (code == 0.0f) return std::nullopt;
  float signalled = signal != 0 ? 1.0f : 0.0f;
  world.all_reduce(&signalled, 1, DType::kF32, ReduceOp::kSum, {.algorithm = Algorithm::kTree});
  const int agreed = int(code);
  return AgreedStop{.signal = agreed / kRankSpan,
                    .rank = kRankSpan - 1 - agreed % kRankSpan,
                    .ranks_signalled = int(signalled)};
}

// "SIGTERM, received by rank 1", "SIGTERM, received by every rank".
std::string stop_origin(const AgreedStop& stop, int world_size) {
  const std::string name = signal_name(stop.signal);
  if (stop.ranks_signalled == world_size && world_size > 1) {
    return fmt::format("{}, received by every rank", name);
  }
  if (stop.ranks_signalled > 1) {
    return fmt::format("{}, received by {} ranks, the first rank {}", name, stop.ranks_signalled,
                       stop.rank);
  }
  return fmt::format("{}, received by rank {}", name, stop.rank);
}

// Prints each newly committed checkpoint once (world rank 0).
// `--plan`: what the planner predicts, once at the start (lattice report compares).
void print_forecast(const nlohmann::json& plan, const std::string& run_dir) {
  if (plan.is_null()) return;
  const std::string source = plan.value("source", std::string());
  if (plan.contains("rejected")) {
    fmt::print("plan ({}): the planner cannot price this layout: {}\n", source,
               plan.at("rejected").get<std::string>());
    return;
  }
  std::string stages;
  for (const nlohmann::json& s : plan.at("stages")) {
    stages += fmt::format("{}{:.1f} MiB", stages.empty() ? "" : ", ",
                          s.at("total").get<double>() / 1048576);
  }
  fmt::print(
      "plan ({}, {}): a step of {:.1f} ms, a rank's peak {} (per pipeline stage) predicted; "
      "lattice report {} draws them next to the measured\n",
      source, plan.value("layout", std::string()), plan.at("step_ms").get<double>(), stages,
      run_dir);
}

void report_committed(const TrainerCheckpointer& checkpoints, bool lead,
                      std::optional<std::filesystem::path>& reported) {
  const std::optional<std::filesystem::path>& dir = checkpoints.last_committed();
  if (!lead || !dir || dir == reported) return;
  fmt::print("checkpoint {} committed\n", dir->string());
  reported = dir;
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

// A stop was requested (preemption): the step just trained is written as a durable checkpoint
// under output.dir/checkpoints, which `--resume auto` continues from.
void save_stop_checkpoint(Trainer& trainer, const TrainConfig& config, DeviceMesh& mesh,
                          const AgreedStop& stop) {
  const bool lead = mesh.world().rank() == 0;
  const std::string origin = stop_origin(stop, mesh.world().size());
  if (config.out_dir.empty()) {
    if (lead) {
      spdlog::warn(
          "stop requested (signal {}: {}) after step {}, but output.dir is empty: nothing "
          "was saved ---> HINT: set output.dir to keep a preempted run's progress",
          stop.signal, origin, trainer.step());
    }
    return;
  }
  const PhaseScope checkpoint(Phase::kCheckpoint);
  const std::filesystem::path dir =
      save_trainer_checkpoint(std::filesystem::path(config.out_dir) / "checkpoints", trainer,
                              &mesh.world(), {.keep_last = int(config.keep_last)});
  if (lead) {
    fmt::print(
        "stopped by signal {} after step {} ({}): checkpoint {} committed (continue with "
        "--resume auto)\n",
        stop.signal, trainer.step(), origin, dir.string());
    std::fflush(stdout);
  }
}

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
  const bool cp = mesh.shape().cp > 1;
  fmt::print(
      "memory peak per rank (MiB): rank (pp, dp, {}tp) | parameters gradients optimizer "
      "activations communication | total\n",
      cp ? "cp, " : "");
  for (int r = 0; r < world; ++r) {
    const MeshCoordinates at = mesh_coordinates(mesh.shape(), r);
    const double* row = peaks.data() + size_t(r) * kColumns;
    fmt::print("  {:>3} ({}, {}, {}{}) | {:10.2f} {:9.2f} {:9.2f} {:11.2f} {:13.2f} | {:.2f}\n", r,
               at.pp, at.dp, cp ? fmt::format("{}, ", at.cp) : "", at.tp, row[0] / 1048576.0,
               row[1] / 1048576.0, row[2] / 1048576.0, row[3] / 1048576.0, row[4] / 1048576.0,
               row[5] / 1048576.0);
  }
}

}  // namespace

void run_training(const TrainConfig& loaded, const RunOptions& args, DeviceMesh& mesh,
                  RankSession* session) {
  Stopwatch wall;
  const bool lead = mesh.world().rank() == 0;
  const ParallelConfig& layout = loaded.parallel;
  // --trace: this rank's events (pipeline instructions, steps) on its own recorder.
  EventRecorder recorder(mesh.world().rank(), args.trace_origin, !args.trace.empty());
  ScopedCurrentRecorder current_recorder(args.trace.empty() ? nullptr : &recorder);
  Arena arena(fmt::format("rank{}", mesh.world().rank()));
  Trainer trainer(loaded, arena, parallel_setup(layout, mesh));
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
        "of T={} ({} tokens) | {} steps | mesh {} on {}: {} rank(s) x {} thread(s){}{}{}{}{}, "
        "fp32 peak {:.1f} GFLOP/s\n",
        config.model.name, trainer.model().registry().global_elements(),
        fmt::format("{}, GEMMs in {}",
                    config.compute_dtype == DType::kBF16 ? "bf16 compute, fp32 master" : "fp32",
                    matmul_library_name()),
        config.global_batch, config.micro_batch, config.micro_batches, layout.dp, config.seq_len,
        config.tokens_per_step(), config.steps, mesh.shape().to_string(),
        transport_name(layout.transport), world, threads,
        layout.dp > 1 ? fmt::format(", zero {}, buckets of {} MB", layout.zero, layout.bucket_mb)
                      : "",
        layout.tp > 1 ? fmt::format(", tensor parallel{}",
                                    layout.sequence_parallel ? " + sequence parallel" : "")
                      : "",
        layout.cp > 1 ? fmt::format(", context parallel: each sequence over {} ranks (ring "
                                    "attention, {} positions a rank)",
                                    layout.cp, config.seq_len / layout.cp)
                      : "",
        layout.pp > 1 ? fmt::format(", pipeline {} (v={})", schedule_kind_name(layout.schedule),
                                    layout.virtual_stages)
                      : "",
        layout.recompute != Recompute::kNone
            ? fmt::format(", recompute {}", recompute_name(layout.recompute))
            : "",
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
  // Every rank's own record of every step, beside the run's checkpoints, and the layout they
  // belong to (lattice report draws the pipeline's theory from it).
  std::optional<RankMetrics> rank_metrics;
  if (!config.out_dir.empty()) {
    if (lead) {
      write_run_info(config.out_dir, {{"model", config.model.name},
                                      {"steps", config.steps},
                                      {"dp", layout.dp},
                                      {"tp", layout.tp},
                                      {"cp", layout.cp},
                                      {"ep", layout.ep},
                                      {"pp", layout.pp},
                                      {"schedule", schedule_kind_name(layout.schedule)},
                                      {"virtual_stages", layout.pp > 1 ? layout.virtual_stages : 1},
                                      {"micro_batches", config.micro_batches},
                                      {"trace", args.trace},
                                      {"plan", args.plan}});
      print_forecast(args.plan, config.out_dir);
    }
    rank_metrics.emplace(config.out_dir, mesh, arena, trainer.step(),
                         layout.comm_profile.empty()
                             ? CostProfile{}
                             : CostProfile::load(layout.comm_profile, layout.transport));
  }
  std::optional<double> last_val;
  std::optional<TrainerCheckpointer> checkpoints = periodic_checkpoints(trainer, config, mesh);
  std::optional<PhaseScope> slot_phase;  // one node: entered while a slot is being written
  std::optional<TrainerCheckpointer> snapshots =
      memory_snapshots(trainer, session, mesh, slot_phase);
  // The snapshot of step N is written by the time step N+1's backward starts: a fault from
  // there on restores step N (at most the step in flight lost). Its forward overlaps the write.
  // Several nodes: its copy on the next node too, so that a lost node loses one step at most.
  if (snapshots) trainer.set_before_backward([&snapshots] { snapshots->wait_written(); });
  std::optional<std::filesystem::path> reported;
  double stall_seconds = 0.0;
  int64_t saves = 0;
  std::optional<AgreedStop> stopped;
  const int64_t first_step = trainer.step();
  // Under lattice launch the agent watches for stragglers from its status records.
  // A bar only where this process owns the terminal (mpirun and lattice launch forward ranks'
  // output through ptys of their own).
  LiveProgress live(
      first_step, config.steps,
      lead && layout.transport == TransportKind::kThreads && ::isatty(STDOUT_FILENO) == 1,
      session != nullptr && layout.transport == TransportKind::kGloo
          ? 0.0
          : config.elastic.straggler_factor);
  Stopwatch loop;                     // from one step's metrics line to the next
  double boundary_snapshot_ms = 0.0;  // the snapshot after the previous step's line
  for (int64_t s = first_step; s < config.steps; ++s) {
    StepMetrics m = trainer.train_step();
    m.snapshot_ms = std::exchange(boundary_snapshot_ms, 0.0);
    if (checkpoints) checkpoints->after_step();  // an async save commits once all ranks wrote
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
    if (!last) stopped = stop_agreed(mesh.world());
    m.loop_ms = loop.milliseconds();
    loop.restart();
    if (rank_metrics) rank_metrics->write(m, peak);
    const bool line_due =
        m.step % config.log_interval == 0 || eval_due || last || m.step == 1 || stopped.has_value();
    live.after_step(m, mesh.world(), line_due);
    if (lead) {
      if (line_due) {
        live.clear_bar();
        fmt::print("{}{}\n", format_progress(m, config.steps, peak), live.eta_suffix(m));
        std::fflush(stdout);
      }
      if (metrics) metrics->write(m, peak);
    }
    // The step's snapshot comes after its metrics lines: a step the next generation restores
    // has its line on every rank, and the line of a step whose snapshot is lost is dropped when
    // the step is trained again (MetricsLog keeps the lines up to the step it continues after).
    if (snapshots) {
      std::optional<PhaseScope> snapshot;
      if (!snapshots->slots()) snapshot.emplace(Phase::kSnapshot);
      Stopwatch snapshot_time;
      snapshots->after_step();
      if (m.step % config.elastic.snapshot_every == 0) snapshots->save();
      slot_phase.reset();
      boundary_snapshot_ms = snapshot_time.milliseconds();
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
    save_stop_checkpoint(trainer, config, mesh, *stopped);
    return;
  }
  const double train_seconds = wall.seconds();
  print_memory_peaks(mesh, arena);
  if (!config.out_dir.empty()) {
    const std::filesystem::path dir = std::filesystem::path(config.out_dir) / "final";
    save_trainer_checkpoint(CheckpointTarget::directory(dir), trainer,
                            &mesh.world());  // every rank writes its part
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
  if (lead && rank_metrics && rank_metrics->step_seconds() > 0) {
    const double steps = double(std::max<int64_t>(1, trainer.step() - first_step));
    fmt::print("per-rank metrics in {}: {:.0f} us a step on rank 0, {:.2f}% of its steps' time\n",
               (std::filesystem::path(config.out_dir) / "metrics").string(),
               1e6 * rank_metrics->write_seconds() / steps,
               100 * rank_metrics->write_seconds() / rank_metrics->step_seconds());
  }
}

}  // namespace lattice
