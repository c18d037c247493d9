#include "doctor/doctor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "ckpt/checkpoint.h"
#include "ckpt/hf_format.h"
#include "ckpt/inspect.h"
#include "ckpt/manifest.h"
#include "ckpt/safetensors.h"
#include "ckpt/trainer_checkpoint.h"
#include "comm/cost_model.h"
#include "core/error.h"
#include "core/model_flops.h"
#include "core/thread_budget.h"
#include "data/token_file.h"
#include "model/model_description.h"
#include "model/parameters.h"
#include "plan/cluster_spec.h"
#include "train/pipeline_stage.h"
#include "train/train_benchmark.h"

namespace lattice::doctor {

namespace fs = std::filesystem;

namespace {

// A deadline must cover this many predicted steps: the longest a rank legitimately waits for a
// peer is about one step (a pipeline's last stage waiting for the first micro-batch), and the
// probe's prediction is rough.
constexpr double kTimeoutMargin = 2.0;
// A step within the margin also fits the stuck verdict of a rank that finished no step yet.
static_assert(kTimeoutMargin * kStuckShareOfDeadline >= 1.0);

// Relative agreement of the probe's layout with its one-rank run: reassociation only in f32;
// bf16 rounds each matmul operand, and a layout sums in another order.
double tolerance(const TrainConfig& config) {
  return config.compute_dtype == DType::kBF16 ? 2e-2 : 1e-6;
}

double relative_difference(double a, double b) {
  return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-30});
}

// A message of a Lattice error split into what happened and its hint.
void set_from_error(CheckResult& result, const std::string& message) {
  const std::string marker = " ---> HINT: ";
  const size_t at = message.find(marker);
  result.saw = message.substr(0, at);
  result.fix = at == std::string::npos ? "" : message.substr(at + marker.size());
}

// "a, b, c and 5 more": the first `shown` of a list.
std::string first_few(const std::vector<std::string>& items, size_t shown) {
  shown = std::min(items.size(), shown);
  return fmt::format("{}{}", fmt::join(items.begin(), items.begin() + ptrdiff_t(shown), ", "),
                     items.size() > shown ? fmt::format(" and {} more", items.size() - shown) : "");
}

std::string coordinates(const MeshCoordinates& at) {
  return fmt::format("pp {} dp {} tp {}", at.pp, at.dp, at.tp);
}

int world_of(const TrainConfig& config) {
  return config.parallel.world_size();
}

// Threads each rank of `config` gets on this machine (thread_budget's rule).
int threads_per_rank(const TrainConfig& config, const MachineFacts& machine) {
  if (config.threads > 0) return config.threads;
  const int ranks_here =
      config.parallel.transport == TransportKind::kThreads ? world_of(config) : 1;
  return std::max(1, machine.cores / ranks_here);
}

TrainConfig resolved(const TrainConfig& config) {
  TrainConfig c = config;
  c.resolve_batch(c.parallel.dp);
  if (c.seq_len == 0) c.seq_len = c.model.seq_len;
  if (c.decay_steps == 0) c.decay_steps = c.steps;
  return c;
}

int64_t model_parameters(const ModelConfig& model) {
  return ParameterRegistry(model).global_elements();
}

double flops_per_step(const TrainConfig& c) {
  const int64_t seq = c.seq_len > 0 ? c.seq_len : c.model.seq_len;
  return model_flops_per_token(model_parameters(c.model), c.model.n_layer, c.model.d_model, seq) *
         double(c.global_batch) * double(seq);
}

// ---- 1. Collective timeouts vs the step ----------------------------------------------------

CheckResult check_timeouts(const DoctorInput& in) {
  CheckResult r;
  const TrainConfig& c = in.config;
  const double deadline = c.collective_timeout_s();
  r.figures = {{"collective_timeout_s", deadline},
               {"heartbeat_interval_s", c.elastic.heartbeat_interval_s},
               {"heartbeat_timeout_s", c.elastic.heartbeat_timeout_s},
               {"progress_timeout_s", c.elastic.progress_timeout_s}};
  try {
    c.check_timeout_ladder();
  } catch (const ConfigError& e) {
    r.verdict = Verdict::kFail;
    set_from_error(r, e.what());
    return r;
  }
  const bool elastic = c.parallel.transport == TransportKind::kGloo;
  const std::string ladder =
      elastic ? fmt::format(
                    "the elastic ladder heartbeat {} s < {} s <= progress {} s < "
                    "collective {} s is in order",
                    c.elastic.heartbeat_interval_s, c.elastic.heartbeat_timeout_s,
                    c.elastic.progress_timeout_s, deadline)
              : fmt::format("collective deadline {} s", deadline);
  if (!in.probe) {
    r.verdict = Verdict::kPass;
    r.saw = ladder + "; the step time was not measured (no probe)";
    return r;
  }
  const double step = predicted_step_seconds(c, *in.probe, in.machine.cores);
  const double needed = kTimeoutMargin * step;
  r.figures["predicted_step_s"] = step;
  const std::string predicted = fmt::format(
      "a step of this config is predicted to take {:.3g} s (the probe's fastest step scaled: the "
      "optimizer by the parameters, the rest by model FLOPs)",
      step);
  if (deadline < needed) {
    r.verdict = Verdict::kFail;
    r.saw = fmt::format(
        "{}, but every collective must complete within parallel.timeout_s = {} s: a rank "
        "waiting for a peer that is still computing would time out",
        predicted, deadline);
    r.fix = fmt::format("--set parallel.timeout_s={:.0f} (at least {} × the predicted step)",
                        std::ceil(needed), kTimeoutMargin);
    return r;
  }
  // Under lattice launch the margin also covers the stuck verdict: a rank reports progress at
  // every layer and a rank that finished no step yet is stuck after half the deadline
  // (elastic/agent.h, stuck_limit_s), which the step fits when the deadline is 2 × the step.
  r.verdict = Verdict::kPass;
  r.saw = fmt::format("{}; {} covers it {:.0f}×{}", predicted, ladder, deadline / step,
                      elastic ? "; a rank is taken for stuck after progress_factor × the longest "
                                "it went without progress in a step, within the progress "
                                "timeout and half the collective deadline"
                              : "");
  return r;
}

// ---- 2. Ranks, threads and cores -----------------------------------------------------------

CheckResult check_cores(const DoctorInput& in) {
  CheckResult r;
  const TrainConfig& c = in.config;
  const MachineFacts& m = in.machine;
  const bool in_process = c.parallel.transport == TransportKind::kThreads;
  const int ranks_here = in_process ? world_of(c) : 1;
  const int threads = threads_per_rank(c, m);
  r.figures = {{"cores", m.cores},
               {"ranks_in_process", ranks_here},
               {"threads_per_rank", threads},
               {"numa_nodes", m.numa_nodes},
               {"numa_nodes_spanned", m.numa_nodes_spanned},
               {"cpu_round_trip_ns", m.cpu_distance.ns},
               {"transparent_huge_pages", m.transparent_huge_pages}};
  const int needed = ranks_here * std::max(1, c.threads);
  if (needed > m.cores && in_process && in.oversubscribe) {
    r.verdict = Verdict::kWarn;
    r.saw = fmt::format(
        "{} in-process ranks on {} cores, one thread each (--oversubscribe): the losses and "
        "checkpoints are the layout's, its step times, tokens/s and MFU are not",
        ranks_here, m.cores);
    r.fix = "time the layout on a machine with enough cores, or under mpirun across machines";
    return r;
  }
  if (needed > m.cores) {
    r.verdict = Verdict::kFail;
    r.saw = fmt::format(
        "{} rank(s) in this process × {} thread(s) need {} cores, {} are available: ranks "
        "would share cores and every timing would measure the scheduler",
        ranks_here, std::max(1, c.threads), needed, m.cores);
    r.fix = in_process
                ? "lower --dp, --tp, --pp or train.threads, run under mpirun with --transport "
                  "mpi, or pass --oversubscribe to lattice train (the results stay exact, the "
                  "timings do not)"
                : "lower train.threads to the cores each process may use";
    return r;
  }
  std::vector<std::string> warnings, fixes;
  if (m.omp_num_threads && *m.omp_num_threads != std::to_string(threads)) {
    warnings.push_back(fmt::format(
        "OMP_NUM_THREADS={} while Lattice gives each rank {} thread(s): code outside Lattice's "
        "budget that reads it (oneDNN, a BLAS) would start more threads than the cores hold",
        *m.omp_num_threads, threads));
    fixes.push_back(
        fmt::format("unset OMP_NUM_THREADS (or set it to {}); Lattice sets each "
                    "rank's budget from train.threads",
                    threads));
  }
  if (m.numa_nodes_spanned > 1) {
    warnings.push_back(fmt::format(
        "this process's {} cores span {} NUMA nodes: its ranks' memory is not local to all of "
        "their cores",
        m.cores, m.numa_nodes_spanned));
    fixes.push_back(
        "bind the process to one node (numactl --cpunodebind=0 --membind=0), or run one "
        "process per node under mpirun --bind-to numa");
  }
  // Above this a cache line's round trip crosses dies or sockets: one die reads tens of ns (the
  // 2-core development VM 55-93 ns; a large server die more), and the VM read 283-423 ns when
  // the host had put its CPUs on different dies (docs/performance.md).
  constexpr double kDiesApartNs = 200;
  if (threads >= 2 && m.cpu_distance.ns > kDiesApartNs) {
    warnings.push_back(fmt::format(
        "that is two dies (a cache line's round trip within one die reads under 200 ns), and a "
        "rank whose {} threads span them runs its memory-bound kernels 2-4x slower (the demo's "
        "2-thread step: 37 ms instead of 26)",
        threads));
    fixes.push_back(
        "give each core a rank of its own (train.threads=1 and dp = the cores: dp 2 lost 2-3% "
        "where the 2-thread rank lost 40%); on a virtual machine the host moves its CPUs after "
        "they idle, so run the doctor again before timing");
  }
  if (m.transparent_huge_pages == "never") {
    warnings.push_back(
        "transparent huge pages are off (never): the arena's tensors lie on 4 KiB pages, and "
        "their TLB misses cost the demo's fp32 step about 4% (docs/performance.md)");
    fixes.push_back(
        "as root: echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (the arena asks "
        "for huge pages with madvise)");
  }
  const std::string fits =
      fmt::format("{} rank(s) in this process × {} thread(s) on {} cores, {} NUMA node(s) of {}",
                  ranks_here, threads, m.cores, m.numa_nodes_spanned, m.numa_nodes) +
      (m.transparent_huge_pages.empty()
           ? std::string()
           : fmt::format(", transparent huge pages {}", m.transparent_huge_pages)) +
      // Last: the warning about CPUs far apart goes on from it.
      (m.cpu_distance.ns > 0 ? fmt::format(", CPUs {} and {} {:.0f} ns apart", m.cpu_distance.cpu_a,
                                           m.cpu_distance.cpu_b, m.cpu_distance.ns)
                             : std::string());
  if (!warnings.empty()) {
    r.verdict = Verdict::kWarn;
    r.saw = fits + "; " + fmt::format("{}", fmt::join(warnings, "; "));
    r.fix = fmt::format("{}", fmt::join(fixes, "; "));
    return r;
  }
  r.verdict = Verdict::kPass;
  r.saw = fits;
  return r;
}

// What one rank of pipeline stage `stage` and tp rank `tp_rank` of `c` (its batch resolved)
// computes, for model/model_description.h's tables.
RankWorkload workload_of(const TrainConfig& c, const StagePartition& partition, int stage,
                         int tp_rank, int dp_rank = 0) {
  const ParallelConfig& p = c.parallel;
  return {.model = c.model,
          .tp = {p.tp, tp_rank, p.sequence_parallel},
          .micro_batch = c.micro_batch,
          .seq_len = c.seq_len,
          .compute_dtype = c.compute_dtype,
          .part = p.pp > 1 ? stage_part(partition, p.pp, stage) : ModelPart{},
          .recompute = p.recompute,
          .deferred_weights = p.pp > 1 && p.schedule == ScheduleKind::kZeroBubbleH1,
          .ep = {.size = p.ep, .rank = dp_rank % p.ep},
          .context_parallel = p.cp > 1};
}

// ---- Memory headroom ------------------------------------------------------------------------

// The bytes one rank of each pipeline stage allocates for its parameters, gradients, optimizer
// state and activations, as model/model_description.h describes the runtime's buffers.
std::vector<int64_t> stage_bytes(const TrainConfig& c) {
  const ParallelConfig& p = c.parallel;
  const int v = p.pp > 1 ? p.virtual_stages : 1;
  std::vector<int64_t> bytes;
  const StagePartition partition = partition_model(c.model, p.pp, v, p.layers_per_chunk);
  const Schedule schedule = make_schedule(p.schedule, p.pp, int(c.micro_batches), v);
  for (int stage = 0; stage < p.pp; ++stage) {
    const RankWorkload w = workload_of(c, partition, stage, 0);
    const ParameterTable params = parameter_table(w, zero_sharding(p.zero, p.dp, 0, p.ep));
    const ActivationTable acts = activation_table(w);
    const int slots = p.pp > 1 ? activation_slots(schedule.per_rank[size_t(stage)]) : 1;
    bytes.push_back(params.parameter_bytes + params.gradient_bytes + params.optimizer_bytes +
                    acts.slot_bytes * slots + acts.scratch_bytes);
  }
  return bytes;
}

CheckResult check_memory(const DoctorInput& in) {
  CheckResult r;
  const MachineFacts& m = in.machine;
  if (m.available_memory_bytes < 0) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "the available memory is unknown (no MemAvailable in /proc/meminfo)";
    return r;
  }
  TrainConfig c;
  std::vector<int64_t> stages;
  try {
    c = resolved(in.config);
    stages = stage_bytes(c);
  } catch (const Error& e) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = fmt::format("the layout does not describe a run ({}); see the other checks", e.what());
    return r;
  }
  const bool in_process = c.parallel.transport == TransportKind::kThreads;
  int64_t largest = 0, total = 0;
  for (int64_t b : stages) {
    largest = std::max(largest, b);
    total += b * c.parallel.dp * c.parallel.tp;
  }
  const int64_t needed = in_process ? total : largest;
  const double share = double(needed) / double(m.available_memory_bytes);
  r.figures = {{"predicted_bytes", needed},
               {"largest_rank_bytes", largest},
               {"available_bytes", m.available_memory_bytes},
               {"share", share}};
  const std::string what = fmt::format(
      "{} {:.3g} GiB (parameters, gradients, optimizer state and activations as the runtime "
      "allocates them) of {:.3g} GiB available ({:.0f}%)",
      in_process ? fmt::format("the {} in-process ranks need", world_of(c))
                 : "the largest rank needs",
      double(needed) / double(1ll << 30), double(m.available_memory_bytes) / double(1ll << 30),
      100 * share);
  const std::string fix =
      "shard more (--zero 1|2|3, --tp, --pp), recompute activations (--recompute selective or "
      "full), or lower batch.micro_batch";
  if (share > 1.0) {
    r.verdict = Verdict::kFail;
    r.saw = what;
    r.fix = fix;
  } else if (share > 0.8) {
    r.verdict = Verdict::kWarn;
    r.saw = what + "; workspace and the allocator's slack come on top";
    r.fix = fix;
  } else {
    r.verdict = Verdict::kPass;
    r.saw = what;
  }
  return r;
}

// ---- 3. Recompute vs tensor parallelism -----------------------------------------------------

// The first way `b` differs from `a`, rank by rank: a step's loss or grad norm, or a
// parameter's values; "" when they agree bit for bit.
std::string first_difference(const LayoutRunResult& a, const LayoutRunResult& b) {
  for (size_t r = 0; r < a.ranks.size() && r < b.ranks.size(); ++r) {
    const RankRun& x = a.ranks[r];
    const RankRun& y = b.ranks[r];
    for (size_t s = 0; s < x.losses.size() && s < y.losses.size(); ++s) {
      if (x.losses[s] != y.losses[s]) {
        return fmt::format("rank {} ({}) step {}: loss {:.17g} vs {:.17g}", r, coordinates(x.at),
                           s + 1, x.losses[s], y.losses[s]);
      }
      if (x.grad_norms[s] != y.grad_norms[s]) {
        return fmt::format("rank {} ({}) step {}: grad norm {:.17g} vs {:.17g}", r,
                           coordinates(x.at), s + 1, x.grad_norms[s], y.grad_norms[s]);
      }
    }
    for (size_t i = 0; i < x.parameter_hashes.size() && i < y.parameter_hashes.size(); ++i) {
      if (x.parameter_hashes[i] != y.parameter_hashes[i]) {
        return fmt::format("rank {} ({}): parameter '{}' differs after the steps", r,
                           coordinates(x.at), x.parameter_names[i]);
      }
    }
  }
  return "";
}

CheckResult check_recompute(const DoctorInput& in) {
  CheckResult r;
  const ParallelConfig& p = in.config.parallel;
  r.figures = {{"recompute", recompute_name(p.recompute)}, {"tp", p.tp}};
  if (p.recompute == Recompute::kNone) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "parallel.recompute = none: nothing is recomputed";
    return r;
  }
  if (!in.probe || !in.probe->without_recompute) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "needs the probe (it runs the layout with and without recompute)";
    return r;
  }
  const std::string difference = first_difference(in.probe->layout, *in.probe->without_recompute);
  const int steps = int(in.probe->layout.ranks.front().losses.size());
  if (!difference.empty()) {
    r.verdict = Verdict::kFail;
    r.saw = fmt::format(
        "the layout with recompute = {} and without it differ: {} (recompute must replay the "
        "forward, its collectives included, exactly once)",
        recompute_name(p.recompute), difference);
    r.fix =
        "train with --recompute none on this layout and report the difference; "
        "lattice explain shows the collectives each layer replays";
    return r;
  }
  r.verdict = Verdict::kPass;
  r.saw = fmt::format(
      "{} probe steps on tp {} with recompute = {} and without: losses, grad norms and every "
      "parameter bitwise equal on all {} ranks",
      steps, p.tp, recompute_name(p.recompute), in.probe->layout.ranks.size());
  return r;
}

// ---- 4. Diverging master weights ------------------------------------------------------------

CheckResult check_replicas(const DoctorInput& in) {
  CheckResult r;
  const ParallelConfig& p = in.config.parallel;
  if (p.dp == 1) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "dp = 1: no replicas";
    return r;
  }
  if (p.zero >= 3) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "ZeRO-3 holds one copy of each parameter over dp: there are no replicas to compare";
    return r;
  }
  if (!in.probe) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "needs the probe (it hashes every replica after its steps)";
    return r;
  }
  const LayoutRunResult& run = in.probe->layout;
  // The ranks of one (pp, tp) position in dp order, and where each holds which parameter: under
  // expert parallelism the dp ranks hold different experts, so each parameter is compared with
  // the lowest dp rank that holds one of the same name (dp 0 for dense ones, the first rank of
  // its expert group for an expert's).
  std::map<std::pair<int, int>, std::vector<const RankRun*>> by_position;
  for (const RankRun& x : run.ranks) by_position[{x.at.pp, x.at.tp}].push_back(&x);
  int64_t compared = 0;
  for (auto& [position, ranks] : by_position) {
    std::sort(ranks.begin(), ranks.end(),
              [](const RankRun* a, const RankRun* b) { return a->at.dp < b->at.dp; });
    std::map<std::string, std::pair<const RankRun*, size_t>> first_holder;
    for (const RankRun* x : ranks) {
      for (size_t i = 0; i < x->parameter_hashes.size(); ++i) {
        const auto [it, first] = first_holder.try_emplace(x->parameter_names[i], x, i);
        if (first) continue;
        ++compared;
        const auto [holder, j] = it->second;
        if (x->parameter_hashes[i] == holder->parameter_hashes[j]) continue;
        r.verdict = Verdict::kFail;
        r.saw = fmt::format(
            "after {} probe steps parameter '{}' differs between dp rank {} and dp rank {} (pp "
            "{}, tp {}): the replicas diverged",
            x->losses.size(), x->parameter_names[i], holder->at.dp, x->at.dp, x->at.pp, x->at.tp);
        r.fix =
            "every dp rank must apply the same reduced gradients: run lattice train with "
            "--check-replicas to stop at the first step where they part";
        r.figures = {{"parameter", x->parameter_names[i]}, {"dp_ranks", {holder->at.dp, x->at.dp}}};
        return r;
      }
      // The moments (ZeRO-0) against the first rank holding the same parameters.
      for (const RankRun* y : ranks) {
        if (y == x) break;
        if (y->parameter_names != x->parameter_names) continue;
        if (x->optimizer_hash && y->optimizer_hash && *x->optimizer_hash != *y->optimizer_hash) {
          r.verdict = Verdict::kFail;
          r.saw = fmt::format(
              "the AdamW moments differ between dp rank {} and dp rank {} (pp {}, tp {})", y->at.dp,
              x->at.dp, x->at.pp, x->at.tp);
          r.fix = "every dp rank must step its optimizer with the same gradients and LR";
          return r;
        }
        break;
      }
    }
  }
  r.verdict = Verdict::kPass;
  r.saw = fmt::format("{} parameter hashes of {} dp replicas after {} probe steps: identical",
                      compared, p.dp, run.ranks.front().losses.size());
  r.figures = {{"compared", compared}};
  return r;
}

// ---- 5. Global batch ------------------------------------------------------------------------

CheckResult check_batch(const DoctorInput& in) {
  CheckResult r;
  TrainConfig c;
  try {
    c = resolved(in.config);
  } catch (const ConfigError& e) {
    r.verdict = Verdict::kFail;
    set_from_error(r, e.what());
    return r;
  }
  r.figures = {{"global_batch", c.global_batch},
               {"micro_batch", c.micro_batch},
               {"micro_batches", c.micro_batches},
               {"dp", c.parallel.dp},
               {"seq_len", c.seq_len},
               {"tokens_per_step", c.tokens_per_step()},
               {"lr", c.lr},
               {"min_lr", c.min_lr},
               {"warmup_steps", c.warmup_steps},
               {"decay_steps", c.decay_steps}};
  const std::string batch = fmt::format(
      "global batch {} = micro-batch {} × {} micro-batches × dp {}; {} tokens per step ({} × "
      "{}); LR {:g} warming up over {} steps, cosine to {:g} at step {}",
      c.global_batch, c.micro_batch, c.micro_batches, c.parallel.dp, c.tokens_per_step(),
      c.global_batch, c.seq_len, c.lr, c.warmup_steps, c.min_lr, c.decay_steps);
  r.verdict = Verdict::kPass;
  r.saw = batch;
  if (!in.resume_from) return r;
  const fs::path dir = *in.resume_from;
  nlohmann::json saved;
  try {
    const Manifest manifest = read_manifest(dir);
    if (!manifest.state.contains("resume_keys")) {
      r.saw += fmt::format(
          "; {} records no resume keys (written before they existed): not compared", dir.string());
      return r;
    }
    saved = manifest.state.at("resume_keys");
  } catch (const Error& e) {
    r.verdict = Verdict::kFail;
    set_from_error(r, e.what());
    return r;
  }
  std::optional<TrainingFileIdentity> data;
  std::error_code ec;
  if (fs::exists(fs::path(c.data_dir) / "train.bin", ec)) {
    const TokenFile train(fs::path(c.data_dir) / "train.bin");
    data = TrainingFileIdentity{.tokens = train.size(), .checksum = train.content_checksum()};
  }
  TrainConfig as_trained = c;  // the Trainer keeps decay_steps as given (0: train.steps)
  as_trained.decay_steps = in.config.decay_steps;
  const std::vector<ResumeChange> changes = resume_changes(saved, resume_keys(as_trained, data));
  if (changes.empty()) {
    r.saw += fmt::format(
        "; {} was trained with the same model, batch, sequence, data, optimizer and LR schedule",
        dir.string());
    return r;
  }
  std::vector<std::string> lines, keeps;
  bool batch_changed = false, lr_changed = false;
  for (const ResumeChange& change : changes) {
    lines.push_back(fmt::format("{}: saved {}, now {}", change.key, change.saved, change.now));
    if (!change.keep.empty()) keeps.push_back(change.keep);
    batch_changed |= change.key == "batch.global_batch";
    lr_changed |= change.key == "optim.lr";
  }
  r.verdict = Verdict::kFail;
  r.saw = fmt::format("resuming {} would change {}", dir.string(), fmt::join(lines, "; "));
  if (batch_changed && !lr_changed) {
    const double saved_batch = saved.at("batch.global_batch").get<double>();
    r.saw += fmt::format(
        "; the LR was not rescaled with the global batch (linear scaling would give optim.lr = "
        "{:.3g})",
        double(c.lr) * double(c.global_batch) / saved_batch);
  } else if (batch_changed && changes.size() == 2 && lr_changed) {
    r.verdict = Verdict::kWarn;  // a deliberate change of both, LR rescaled
  }
  r.fix = fmt::format(
      "resume with the saved values ({}), or accept the change with "
      "--resume-allow-change KEY",
      keeps.empty() ? "the same data" : fmt::format("{}", fmt::join(keeps, " ")));
  return r;
}

// ---- A checkpoint against the config ---------------------------------------------------------

CheckResult check_checkpoint(const DoctorInput& in) {
  CheckResult r;
  if (!in.resume_from) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "no checkpoint given (--resume DIR or --ckpt DIR)";
    return r;
  }
  const fs::path dir = *in.resume_from;
  const CheckpointReport report = inspect_checkpoint(dir, /*verify=*/true);
  if (!report.valid) {
    const size_t at = report.text.find("status      ");
    r.verdict = Verdict::kFail;
    r.saw = fmt::format("{}: {}", dir.string(),
                        at == std::string::npos ? report.text : report.text.substr(at + 12));
    while (!r.saw.empty() && r.saw.back() == '\n') r.saw.pop_back();
    r.fix =
        "resume from an earlier checkpoint (lattice train --resume auto picks the newest "
        "valid one); lattice ckpt inspect DIR lists every file";
    return r;
  }
  if (is_legacy_checkpoint(dir)) {
    r.verdict = Verdict::kPass;
    r.saw = fmt::format(
        "{} is in the earlier single-rank format: its tensors are checked when "
        "it loads",
        dir.string());
    return r;
  }
  const Manifest manifest = read_manifest(dir);
  const ParameterRegistry registry(in.config.model);
  std::vector<std::string> missing, misshaped, unexpected;
  std::set<std::string> expected;
  for (const ParameterSpec& spec : registry.specs()) {
    if (spec.tied_copy) continue;
    for (const std::string& name : {spec.name, spec.name + ".exp_avg", spec.name + ".exp_avg_sq"}) {
      expected.insert(name);
      const TensorRecord* t = manifest.find(name);
      if (t == nullptr) {
        missing.push_back(name);
      } else if (t->shape != spec.shape || t->dtype != DType::kF32) {
        misshaped.push_back(fmt::format("{} {}{} (the model's: f32{})", name, dtype_name(t->dtype),
                                        t->shape.to_string(), spec.shape.to_string()));
      }
    }
  }
  for (const TensorRecord& t : manifest.tensors)
    if (!expected.contains(t.name)) unexpected.push_back(t.name);
  r.figures = {{"step", manifest.step},          {"tensors", manifest.tensors.size()},
               {"files", manifest.files.size()}, {"missing", missing.size()},
               {"misshaped", misshaped.size()},  {"unexpected", unexpected.size()}};
  if (!missing.empty() || !misshaped.empty() || !unexpected.empty()) {
    std::vector<std::string> problems;
    const auto some = [](const std::vector<std::string>& items) { return first_few(items, 3); };
    if (!missing.empty()) problems.push_back("missing " + some(missing));
    if (!misshaped.empty()) problems.push_back("of another shape or dtype " + some(misshaped));
    if (!unexpected.empty()) problems.push_back("not the model's " + some(unexpected));
    r.verdict = Verdict::kFail;
    r.saw = fmt::format("{} (step {}) does not hold model '{}': {}", dir.string(), manifest.step,
                        in.config.model.name, fmt::join(problems, "; "));
    r.fix =
        "resume with the [model] keys it was trained with (lattice ckpt inspect DIR shows "
        "them), or start a new run";
    return r;
  }
  const CheckpointLayout& l = manifest.layout;
  r.verdict = Verdict::kPass;
  r.saw = fmt::format(
      "{} (step {}, written by dp {} × tp {} × pp {}, ZeRO-{}): every file's size and CRC32C "
      "verified, all {} parameters of model '{}' with both AdamW moments, f32, their global "
      "shapes (any layout loads it)",
      dir.string(), manifest.step, l.dp, l.tp, l.pp, l.zero, registry.specs().size(),
      in.config.model.name);
  return r;
}

// ---- 6. Attention vs tensor parallelism -----------------------------------------------------

CheckResult check_attention_tp(const DoctorInput& in) {
  CheckResult r;
  const TrainConfig& c = in.config;
  const ParallelConfig& p = c.parallel;
  r.figures = {{"tp", p.tp}, {"n_head", c.model.n_head}, {"n_kv_head", c.model.n_kv_head}};
  if (p.tp == 1) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "tp = 1: attention is not split";
    return r;
  }
  try {
    validate_tensor_parallel(c.model, {p.tp, 0, p.sequence_parallel});
  } catch (const ConfigError& e) {
    r.verdict = Verdict::kFail;
    set_from_error(r, e.what());
    return r;
  }
  const std::string split =
      fmt::format("{} query and {} kv heads of size {} split over tp {}", c.model.n_head,
                  c.model.n_kv_head, c.model.head_size(), p.tp);
  if (!in.probe) {
    r.verdict = Verdict::kPass;
    r.saw = split + "; the probe did not run";
    return r;
  }
  const double layout = in.probe->layout.losses.front();
  const double single = in.probe->single.losses.front();
  const double diff = relative_difference(layout, single);
  r.figures["first_loss"] = layout;
  r.figures["first_loss_one_rank"] = single;
  if (diff > tolerance(c)) {
    r.verdict = Verdict::kFail;
    r.saw = fmt::format(
        "{}, but the probe's first loss {:.9g} differs from the one-rank run's {:.9g} by {:.2g} "
        "(relative; allowed {:.0e}): the sharded attention does not compute the whole one",
        split, layout, single, diff, tolerance(c));
    r.fix = "lattice explain --tp N shows each rank's heads; compare with --tp 1";
    return r;
  }
  r.verdict = Verdict::kPass;
  r.saw =
      fmt::format("{}; the probe's first loss {:.9g} equals the one-rank run's ({:.2g} relative)",
                  split, layout, diff);
  return r;
}

// ---- 7. dtype on load -----------------------------------------------------------------------

CheckResult check_dtype_load(const DoctorInput& in) {
  CheckResult r;
  if (!in.init_from) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "no --init-from: the model starts from its seed";
    return r;
  }
  const fs::path& source = *in.init_from;
  HfWeightsSurvey survey;
  try {
    survey = survey_hf_weights(source, in.config.model);
  } catch (const Error& e) {
    r.verdict = Verdict::kFail;
    set_from_error(r, e.what());
    return r;
  }
  using Kind = HfTensorSurvey::Kind;
  std::map<Kind, std::vector<std::string>> by_kind;
  std::map<std::string, int> widened_from;
  for (const HfTensorSurvey& t : survey.tensors) {
    std::string line =
        fmt::format("{} {}{}", t.file_name, safetensors_dtype_name(t.dtype), t.shape.to_string());
    if (t.kind == Kind::kMisshaped) line += fmt::format(" (expected {})", t.expected.to_string());
    by_kind[t.kind].push_back(line);
    if (t.kind == Kind::kWidened) ++widened_from[std::string(safetensors_dtype_name(t.dtype))];
  }
  const auto count = [&](Kind kind) { return int64_t(by_kind[kind].size()); };
  r.figures = {{"exact", count(Kind::kExact)},
               {"widened", count(Kind::kWidened)},
               {"refused", count(Kind::kRefused)},
               {"misshaped", count(Kind::kMisshaped)},
               {"unexpected", count(Kind::kUnexpected)},
               {"skipped", count(Kind::kSkipped)},
               {"missing", int64_t(survey.missing.size())}};
  const auto first = [](const std::vector<std::string>& items) { return first_few(items, 4); };
  std::vector<std::string> problems;
  if (!survey.missing.empty()) problems.push_back("missing " + first(survey.missing));
  if (count(Kind::kUnexpected) > 0)
    problems.push_back("unexpected " + first(by_kind[Kind::kUnexpected]));
  if (count(Kind::kMisshaped) > 0)
    problems.push_back("mis-shaped " + first(by_kind[Kind::kMisshaped]));
  if (count(Kind::kRefused) > 0) {
    problems.push_back("of a dtype the load refuses (F32, BF16, F16 only) " +
                       first(by_kind[Kind::kRefused]));
  }
  if (!problems.empty()) {
    r.verdict = Verdict::kFail;
    r.saw = fmt::format("{} does not load into model '{}': {}", source.string(),
                        in.config.model.name, fmt::join(problems, "; "));
    r.fix =
        "the weights must be the model's parameters under Hugging Face names: set the "
        "[model] keys (or the preset) to the checkpoint's architecture";
    return r;
  }
  std::vector<std::string> widened;
  for (const auto& [dtype, n] : widened_from)
    widened.push_back(fmt::format("{} from {}", n, dtype));
  r.verdict = Verdict::kPass;
  r.saw = fmt::format(
      "{}: {} tensors load into the f32 master weights, {} as stored (F32){}{}; the compute "
      "copy is {}{}",
      source.string(), count(Kind::kExact) + count(Kind::kWidened), count(Kind::kExact),
      widened.empty() ? "" : fmt::format(", {} widened exactly", fmt::join(widened, ", ")),
      count(Kind::kSkipped) > 0 ? fmt::format(", {} non-parameters skipped", count(Kind::kSkipped))
                                : "",
      dtype_name(in.config.compute_dtype),
      in.config.compute_dtype == DType::kBF16
          ? " (rounded from the f32 master each step: mixed precision narrows nothing stored)"
          : "");
  return r;
}

// ---- 8. Sharding that does not shard --------------------------------------------------------

CheckResult check_sharding(const DoctorInput& in) {
  CheckResult r;
  const ParallelConfig& p = in.config.parallel;
  if (p.dp == 1 || p.zero == 0) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = p.dp == 1 ? "dp = 1: nothing is sharded over data parallelism"
                      : "parallel.zero = 0: every dp rank holds everything";
    return r;
  }
  if (!in.probe) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "needs the probe (it measures each rank's bytes by category)";
    return r;
  }
  const TrainConfig& slice = in.probe->config;
  const LayoutRunResult& run = in.probe->layout;
  const StagePartition partition =
      partition_model(slice.model, p.pp, p.pp > 1 ? p.virtual_stages : 1, {});
  struct Category {
    MemoryCategory category;
    const char* name;
    int from_stage;  // the ZeRO stage that shards it
  };
  const Category categories[] = {{MemoryCategory::kOptimizerState, "optimizer state", 1},
                                 {MemoryCategory::kGradients, "gradients", 2},
                                 {MemoryCategory::kParameters, "parameters", 3}};
  for (const RankRun& rank : run.ranks) {
    const RankWorkload w = workload_of(slice, partition, rank.at.pp, rank.at.tp, rank.at.dp);
    const ParameterTable expected =
        parameter_table(w, zero_sharding(p.zero, p.dp, rank.at.dp, p.ep));
    const int64_t expected_bytes[] = {expected.optimizer_bytes, expected.gradient_bytes,
                                      expected.parameter_bytes};
    for (int i = 0; i < 3; ++i) {
      if (p.zero < categories[i].from_stage) continue;
      const int64_t measured =
          int64_t(rank.finished.live_by_category[size_t(categories[i].category)]);
      if (&rank == &run.ranks.front()) {
        r.figures[categories[i].name] = {{"measured_bytes", measured},
                                         {"expected_bytes", expected_bytes[i]}};
      }
      // ZeRO-2/3's lent buckets and gathered layers are transient; a quarter on top is slack.
      if (double(measured) <= 1.25 * double(expected_bytes[i]) + 4096) continue;
      r.verdict = Verdict::kFail;
      r.saw = fmt::format(
          "rank {} holds {} bytes of {} after the probe steps, but ZeRO-{} over dp {} should "
          "leave it {} bytes: the {} is not sharded",
          coordinates(rank.at), measured, categories[i].name, p.zero, p.dp, expected_bytes[i],
          categories[i].name);
      r.fix =
          "a buffer of the full size survives the sharding; lattice train prints each "
          "rank's memory by category at the end, compare it with lattice explain";
      r.figures = {{"category", categories[i].name},
                   {"measured_bytes", measured},
                   {"expected_bytes", expected_bytes[i]}};
      return r;
    }
  }
  const nlohmann::json& optimizer = r.figures.at("optimizer state");
  r.verdict = Verdict::kPass;
  r.saw = fmt::format(
      "every rank's bytes of what ZeRO-{} shards match the sharded sizes after the probe steps "
      "({} ranks; rank 0's optimizer state {} bytes, expected {})",
      p.zero, run.ranks.size(), optimizer.at("measured_bytes").get<int64_t>(),
      optimizer.at("expected_bytes").get<int64_t>());
  return r;
}

// ---- 9. Network flow control and stalled links ----------------------------------------------

// A collective's calls count as stalled when they take this much longer than the cost model
// says, and long enough that it is not noise. Only calls of at least kStallBytes are judged: a
// small call's time is the wait for the slowest peer to arrive, not the link.
constexpr double kStallFactor = 50;
constexpr double kStallSeconds = 20e-3;
constexpr double kStallBytes = 64 * 1024;

// The counters that rose over the probe, each as `format` of (name, rise).
template <typename Format>
std::vector<std::string> risen_counters(const std::map<std::string, int64_t>& deltas,
                                        Format format) {
  std::vector<std::string> risen;
  for (const auto& [name, rise] : deltas) {
    if (rise > 0) risen.push_back(format(name, rise));
  }
  return risen;
}

CheckResult check_network(const DoctorInput& in) {
  CheckResult r;
  const std::vector<std::string> paused =
      risen_counters(in.port_xmit_wait_during_probe, [](const std::string& port, int64_t waits) {
        return fmt::format("{} ({} waits)", port, waits);
      });
  if (!paused.empty()) {
    r.verdict = Verdict::kWarn;
    r.saw = fmt::format(
        "RDMA port(s) {} counted port_xmit_wait during the probe: data waited for credit, "
        "the PFC back-pressure of a congested or misconfigured link",
        fmt::join(paused, ", "));
    r.fix =
        "check the switch's and NIC's PFC/ECN settings and `ethtool -S` pause frames; "
        "spread the job off the congested port";
    return r;
  }
  const std::vector<std::string> pauses =
      risen_counters(in.pause_frames_during_probe, [](const std::string& counter, int64_t frames) {
        return fmt::format("{} +{}", counter, frames);
      });
  if (!pauses.empty()) {
    r.verdict = Verdict::kWarn;
    r.saw = fmt::format(
        "NIC pause counters rose during the probe ({}): a link was paused by flow control "
        "(802.3x or PFC), the receiver or the switch could not keep up",
        fmt::join(pauses, ", "));
    r.fix =
        "check the switch's PFC/ECN and buffer settings for these ports (ethtool -S IFACE, "
        "ethtool -a IFACE), or move the job off the congested link";
    r.figures = {{"paused_counters", pauses.size()}};
    return r;
  }
  const bool any_traffic =
      in.probe && std::any_of(in.probe->layout.ranks.begin(), in.probe->layout.ranks.end(),
                              [](const RankRun& rank) { return !rank.traffic.empty(); });
  if (!any_traffic) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = in.probe ? "the layout has no dp or tp group: nothing crosses a link"
                     : "needs the probe (it times each group's collectives)";
    return r;
  }
  CostProfile profile;
  const std::string& profile_path = in.config.parallel.comm_profile;
  if (!profile_path.empty()) profile = CostProfile::load(profile_path);
  double worst = 0;
  std::string worst_line;
  for (const RankRun& rank : in.probe->layout.ranks) {
    for (const GroupTraffic& t : rank.traffic) {
      const double bytes = double(t.bytes) / double(t.calls);
      const double measured = t.seconds / double(t.calls);
      const CostModel model =
          profile.find(t.collective, Algorithm::kRing, t.size)
              .value_or(default_cost_model(t.collective, Algorithm::kRing, t.size));
      const double predicted = std::max(model.predict(bytes), 1e-9);
      const double factor = measured / predicted;
      const std::string line = fmt::format(
          "rank {}'s {} {}: {} calls of {:.0f} KiB took {:.3g} ms each, the {} model predicts "
          "{:.3g} ms ({:.0f}×)",
          coordinates(rank.at), t.group, collective_name(t.collective), t.calls, bytes / 1024,
          1e3 * measured, profile_path.empty() ? "analytic" : "calibrated", 1e3 * predicted,
          factor);
      if (bytes < kStallBytes) continue;
      if (factor > worst) {
        worst = factor;
        worst_line = line;
      }
      if (factor > kStallFactor && measured > kStallSeconds) {
        r.verdict = Verdict::kWarn;
        r.saw = line + ": a link stalls";
        r.fix =
            "lattice bench comm --ranks N shows each link's bandwidth; a slow or shared "
            "link, a peer descheduled, or a profile measured on another machine "
            "(parallel.comm_profile)";
        r.figures = {{"factor", factor}, {"measured_s", measured}, {"predicted_s", predicted}};
        return r;
      }
    }
  }
  r.verdict = Verdict::kPass;
  r.saw = fmt::format(
      "no stalled link{}{}; {}",
      in.port_xmit_wait_during_probe.empty() ? " (no RDMA port to read flow-control counters from)"
                                             : ", no RDMA port waited",
      in.pause_frames_during_probe.empty() ? ", no NIC pause counters (ethtool -S)"
                                           : ", no NIC pause frame",
      worst_line.empty() ? "no call of 64 KiB or more to judge"
                         : "the slowest call of 64 KiB or more against its model: " + worst_line);
  r.figures = {{"worst_factor", worst}};
  return r;
}

// ---- 10. Overlap broken ----------------------------------------------------------------------

// Gradients below this reduce in well under a millisecond on any link: one bucket is fine.
constexpr double kOverlapWorthBytes = 8.0 * (1 << 20);

// The final wait for a stage's non-blocking sends above this share of its step: a neighbour
// takes them late, and the transfer is no longer behind compute.
constexpr double kExposedSendShare = 0.10;
// ... and above this long: a shorter wait is a time slice of a shared machine's scheduler.
constexpr double kExposedSendSeconds = 10e-3;

CheckResult gradient_overlap(const DoctorInput& in) {
  CheckResult r;
  const ParallelConfig& p = in.config.parallel;
  if (p.dp == 1) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "dp = 1: no gradient reduction to overlap";
    return r;
  }
  if (!in.probe) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "needs the probe (it watches the gradient buckets start during backward)";
    return r;
  }
  const double assumed = plan::RuntimeFactors{}.dp_overlap;
  double communication = 0, exposed = 0;
  for (const RankRun& rank : in.probe->layout.ranks) {
    const GradientSyncStats& s = rank.gradient_sync;
    communication += s.communication_seconds;
    exposed += s.exposed_seconds;
    if (s.buckets >= 2 && s.launched_during_backward == 0) {
      r.verdict = Verdict::kFail;
      r.saw = fmt::format(
          "rank {}: none of its {} gradient buckets started before backward ended: the "
          "gradient-ready hooks did not fire, so every reduction waits for the whole backward",
          coordinates(rank.at), s.buckets);
      r.fix =
          "the model's parameters must report ready during backward (Transformer::"
          "set_grad_ready_hook, set by the Trainer's GradientSync): something replaced the "
          "hook or the backward that calls it";
      r.figures = {{"buckets", s.buckets}, {"launched_during_backward", 0}};
      return r;
    }
  }
  const RankRun& first = in.probe->layout.ranks.front();
  const double hidden =
      communication > 0 ? std::clamp(1.0 - exposed / communication, 0.0, 1.0) : 1.0;
  r.figures = {{"buckets", first.gradient_sync.buckets},
               {"launched_during_backward", first.gradient_sync.launched_during_backward},
               {"hidden_share", hidden},
               {"planner_assumed_overlap", assumed}};
  const std::string probed = fmt::format(
      "{} of {} gradient buckets started during backward on the probe's rank 0; {:.0f}% of the "
      "reduction time was hidden on its slice (the planner assumes {:.0f}% of backward can "
      "hide it; the slice is too small for its timing to speak for the run)",
      first.gradient_sync.launched_during_backward, first.gradient_sync.buckets, 100 * hidden,
      100 * assumed);
  // The run's own buckets: one bucket of all a rank's gradients starts only when backward ends.
  const ModelPart part =
      p.pp > 1
          ? stage_part(partition_model(in.config.model, p.pp, p.virtual_stages, p.layers_per_chunk),
                       p.pp, 0)
          : ModelPart{};
  const double gradient_bytes =
      4.0 * double(ParameterRegistry(in.config.model, {p.tp, 0, p.sequence_parallel}, part)
                       .total_elements());
  const double bucket_bytes = p.bucket_mb * double(1 << 20);
  r.figures["gradient_bytes"] = gradient_bytes;
  r.figures["bucket_bytes"] = bucket_bytes;
  if (gradient_bytes <= bucket_bytes && gradient_bytes > kOverlapWorthBytes) {
    r.verdict = Verdict::kWarn;
    r.saw = fmt::format(
        "parallel.bucket_mb = {:g} holds all {:.3g} MB of a rank's gradients: one bucket, which "
        "starts only when backward has ended, so none of the reduction can hide behind it; {}",
        p.bucket_mb, gradient_bytes / double(1 << 20), probed);
    r.fix = fmt::format(
        "--bucket-mb {:.2g} (an eighth of the gradients: backward then starts "
        "reducing after its first eighth)",
        gradient_bytes / double(1 << 20) / 8);
    return r;
  }
  r.verdict = Verdict::kPass;
  r.saw =
      fmt::format("the run's {:.3g} MB of gradients per rank make {:.0f} bucket(s) of {:g} MB; {}",
                  gradient_bytes / double(1 << 20), std::ceil(gradient_bytes / bucket_bytes),
                  p.bucket_mb, probed);
  return r;
}

// Pipeline sends are posted without blocking and waited for at the end of the step
// (parallel/pipeline_runtime.h): what compute did not hide is that final wait.
CheckResult pipeline_send_overlap(const DoctorInput& in) {
  CheckResult r;
  if (in.config.parallel.pp == 1) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "pp = 1: no pipeline sends to overlap";
    return r;
  }
  if (!in.probe) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "needs the probe (it times each stage's wait for its sends)";
    return r;
  }
  const RankRun* worst = nullptr;
  double worst_share = -1;
  for (const RankRun& rank : in.probe->layout.ranks) {
    const PipelineStepStats& s = rank.pipeline;
    if (s.step_seconds <= 0) continue;
    const double share = s.send_wait_seconds / s.step_seconds;
    if (share > worst_share) {
      worst_share = share;
      worst = &rank;
    }
  }
  if (worst == nullptr) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "the probe ran no pipeline step";
    return r;
  }
  const PipelineStepStats& s = worst->pipeline;
  r.figures = {{"pipeline_send_wait_s", s.send_wait_seconds},
               {"pipeline_step_s", s.step_seconds},
               {"pipeline_send_wait_share", worst_share},
               {"pipeline_sends_rank", worst->at.pp}};
  const std::string seen = fmt::format(
      "pipeline sends: rank {} waited {:.3g} ms for its sends after its last instruction, "
      "{:.1f}% of its {:.3g} ms probe step (the planner counts transfers as exposed)",
      coordinates(worst->at), 1e3 * s.send_wait_seconds, 100 * worst_share, 1e3 * s.step_seconds);
  if (worst_share > kExposedSendShare && s.send_wait_seconds > kExposedSendSeconds) {
    r.verdict = Verdict::kWarn;
    r.saw = fmt::format("{}: over {:.0f}% and {:.0f} ms, the next stage takes them late", seen,
                        100 * kExposedSendShare, 1e3 * kExposedSendSeconds);
    r.fix =
        "look at the link between the stages (lattice bench comm; the network check) and at "
        "the stages' balance (parallel.layers_per_chunk, lattice explain)";
    return r;
  }
  r.verdict = Verdict::kPass;
  r.saw = seen;
  return r;
}

// Both overlaps in one verdict, the worse one's fix.
CheckResult check_overlap(const DoctorInput& in) {
  const CheckResult parts[] = {gradient_overlap(in), pipeline_send_overlap(in)};
  auto severity = [](Verdict v) {
    return v == Verdict::kFail ? 3 : v == Verdict::kWarn ? 2 : v == Verdict::kPass ? 1 : 0;
  };
  CheckResult r;
  std::vector<std::string> saw;
  for (const CheckResult& part : parts) {
    if (severity(part.verdict) > severity(r.verdict)) {
      r.verdict = part.verdict;
      r.fix = part.fix;
    }
    saw.push_back(part.saw);
    r.figures.update(part.figures);
  }
  r.saw = fmt::format("{}", fmt::join(saw, "; "));
  return r;
}

// ---- 11. Checkpoint directory ---------------------------------------------------------------

CheckResult check_checkpoint_dir(const DoctorInput& in) {
  CheckResult r;
  const TrainConfig& c = in.config;
  if (c.out_dir.empty()) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "output.dir is unset: the run writes no checkpoint";
    return r;
  }
  const fs::path dir = c.out_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path marker = dir / fmt::format(".lattice-doctor-{}", ::getpid());
  bool written = false;
  if (!ec) {
    std::ofstream out(marker);
    written = bool(out << "lattice doctor\n");
  }
  fs::remove(marker, ec);
  if (!written) {
    r.verdict = Verdict::kFail;
    r.saw = fmt::format("output.dir '{}' cannot be created or written", dir.string());
    r.fix = "--set output.dir=DIR with a directory every rank can write";
    return r;
  }
  const int64_t checkpoint_bytes = model_parameters(c.model) * 12;  // master + m + v, f32
  const int64_t copies = c.keep_last > 0 ? c.keep_last + 1 : 2;     // the new one is staged first
  struct statvfs fs_stats {};
  const int64_t free_bytes = ::statvfs(dir.c_str(), &fs_stats) == 0
                                 ? int64_t(fs_stats.f_bavail) * int64_t(fs_stats.f_frsize)
                                 : -1;
  r.figures = {
      {"checkpoint_bytes", checkpoint_bytes}, {"free_bytes", free_bytes}, {"copies", copies}};
  if (free_bytes >= 0 && free_bytes < checkpoint_bytes) {
    r.verdict = Verdict::kFail;
    r.saw = fmt::format("'{}' has {:.3g} GB free but one checkpoint takes {:.3g} GB", dir.string(),
                        double(free_bytes) / 1e9, double(checkpoint_bytes) / 1e9);
    r.fix = "free space, or --set output.dir=DIR on a larger file system";
    return r;
  }
  std::vector<std::string> leftovers;
  for (const fs::path& root : {dir, dir / "checkpoints"}) {
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      if (entry.is_directory() && entry.path().extension() == ".tmp") {
        leftovers.push_back(entry.path().string());
      }
    }
  }
  std::sort(leftovers.begin(), leftovers.end());
  const std::string space =
      free_bytes < 0
          ? "free space unknown"
          : fmt::format("{:.3g} GB free for {} checkpoint(s) of {:.3g} GB",
                        double(free_bytes) / 1e9, copies, double(checkpoint_bytes) / 1e9);
  if (!leftovers.empty()) {
    r.verdict = Verdict::kWarn;
    r.saw = fmt::format("'{}' is writable, {}; an interrupted save left {}", dir.string(), space,
                        fmt::join(leftovers, ", "));
    r.fix =
        "they are never loaded; the next save of that step replaces it, or remove them "
        "with rm -r to free the space";
    return r;
  }
  if (free_bytes >= 0 && free_bytes < checkpoint_bytes * copies) {
    r.verdict = Verdict::kWarn;
    r.saw = fmt::format("'{}' is writable but {}", dir.string(), space);
    r.fix = "lower output.keep_last or free space";
    return r;
  }
  r.verdict = Verdict::kPass;
  r.saw =
      fmt::format("'{}' is writable, {}, no leftovers of an interrupted save", dir.string(), space);
  return r;
}

// ---- 12. Local instead of global grad norm ---------------------------------------------------

// ---- GEMM library for the run's shapes ----------------------------------------------------

// The configured library against the fastest one on the run's GEMM: another library measured
// 25 % or more faster on this machine (oneMKL on a CPU whose AMX tiles it drives and oneDNN 2.6
// does not, say) is a WARN that names the setting. The margin is wide because small GEMMs' best
// of a few calls moves by ±10 % between runs; the differences worth a setting are larger.
CheckResult check_gemm_library(const DoctorInput& in) {
  CheckResult r;
  const GemmLibrary configured = in.config.gemm_library;
  r.figures = {{"configured", gemm_library_key(configured)}};
  if (!in.gemm_libraries) {
    r.verdict = Verdict::kNotApplicable;
    r.saw =
        "not measured (lattice doctor times the run's GEMM in each library; --preflight "
        "does not)";
    return r;
  }
  const GemmLibraryTiming& t = *in.gemm_libraries;
  const std::string shape = fmt::format("M {} K {} N {}, {}, {} thread(s)", t.m, t.k, t.n,
                                        t.dtype == DType::kBF16 ? "bf16" : "fp32", t.threads);
  r.figures["shape"] = {t.m, t.k, t.n};
  r.figures["dtype"] = t.dtype == DType::kBF16 ? "bf16" : "fp32";
  r.figures["threads"] = t.threads;
  std::string rates;
  GemmLibrary fastest = configured;
  for (const auto& [library, flops] : t.flops_per_s) {
    r.figures[fmt::format("{}_gflops", gemm_library_key(library))] = flops / 1e9;
    rates += fmt::format("{}{} {:.1f}", rates.empty() ? "" : ", ", gemm_library_name(library),
                         flops / 1e9);
    if (!t.flops_per_s.contains(fastest) || flops > t.flops_per_s.at(fastest)) fastest = library;
  }
  if (t.flops_per_s.size() < 2 || !t.flops_per_s.contains(configured)) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = fmt::format(
        "one GEMM library to choose from here ({} GFLOP/s on the run's MLP GEMM, {}); "
        "scripts/setup.sh unpacks oneMKL for a second",
        rates, shape);
    return r;
  }
  const double mine = t.flops_per_s.at(configured), best = t.flops_per_s.at(fastest);
  r.figures["fastest"] = gemm_library_key(fastest);
  if (fastest != configured && best >= 1.25 * mine) {
    r.verdict = Verdict::kWarn;
    r.saw = fmt::format(
        "train.gemm_library = \"{}\": the run's MLP GEMM ({}) at {:.1f} GFLOP/s here; {} "
        "reaches {:.1f} ({:.2f}x) (all: {} GFLOP/s)",
        gemm_library_key(configured), shape, mine / 1e9, gemm_library_name(fastest), best / 1e9,
        best / mine, rates);
    r.fix = fmt::format(
        "set train.gemm_library = \"{}\" (lattice bench train --gemm-library {},{} --profile "
        "compares every GEMM of the step and the whole step)",
        gemm_library_key(fastest), gemm_library_key(configured), gemm_library_key(fastest));
    return r;
  }
  r.verdict = Verdict::kPass;
  r.saw = fmt::format("train.gemm_library = \"{}\": {} on the run's MLP GEMM ({}): {} GFLOP/s",
                      gemm_library_key(configured),
                      fastest == configured ? "the fastest library here"
                                            : "within 25 % of the fastest library here",
                      shape, rates);
  return r;
}

CheckResult check_grad_norm(const DoctorInput& in) {
  CheckResult r;
  if (!in.probe) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "needs the probe (it compares the layout's grad norms with one rank's)";
    return r;
  }
  const LayoutRunResult& run = in.probe->layout;
  const std::vector<double>& single = in.probe->single.ranks.front().grad_norms;
  const double allowed = tolerance(in.config);
  double worst = 0;
  for (const RankRun& rank : run.ranks) {
    for (size_t s = 0; s < rank.grad_norms.size() && s < single.size(); ++s) {
      const double diff = relative_difference(rank.grad_norms[s], single[s]);
      worst = std::max(worst, diff);
      if (diff <= allowed) continue;
      r.verdict = Verdict::kFail;
      r.saw = fmt::format(
          "step {}: rank {} measured grad norm {:.9g}, the one-rank run of the same batch "
          "{:.9g} ({:.2g} relative, allowed {:.0e}): the clip uses a norm that is not the "
          "global one",
          s + 1, coordinates(rank.at), rank.grad_norms[s], single[s], diff, allowed);
      r.fix =
          "the norm must sum every rank's squares over tp, pp and the dp shards "
          "(train/grad_norm.h global_grad_norm) before the clip";
      r.figures = {{"step", s + 1}, {"measured", rank.grad_norms[s]}, {"one_rank", single[s]}};
      return r;
    }
  }
  r.verdict = Verdict::kPass;
  r.saw = fmt::format(
      "every rank's grad norm of {} probe steps equals the one-rank run's "
      "(worst {:.2g} relative, allowed {:.0e})",
      single.size(), worst, allowed);
  r.figures = {{"worst_relative", worst}};
  return r;
}

}  // namespace

GemmLibraryTiming time_gemm_libraries(const TrainConfig& config, const MachineFacts& machine) {
  TrainConfig c = config;
  try {
    c = resolved(config);
  } catch (const ConfigError&) {
    // The batch check names the problem; the GEMM is timed on one sequence per micro-batch.
    c.micro_batch = std::max<int64_t>(1, c.micro_batch);
    if (c.seq_len == 0) c.seq_len = c.model.seq_len;
  }
  const ParallelConfig& p = c.parallel;
  GemmLibraryTiming t;
  t.m = std::clamp<int64_t>(c.micro_batch * c.seq_len / std::max(1, p.cp), 1, 1024);
  t.k = std::clamp<int64_t>(c.model.d_model, 1, 4096);
  t.n = std::clamp<int64_t>(c.model.d_ff / std::max(1, p.tp), 1, 4096);
  t.dtype = c.compute_dtype;
  // Never more threads than this process may run (the cores check judges the budget).
  t.threads = std::clamp(threads_per_rank(c, machine), 1, std::max(1, available_cores()));
  const GemmProblem problem{.m = t.m, .k = t.k, .n = t.n, .input = t.dtype, .output = t.dtype};
  for (const auto& [library, seconds] : measure_gemm_seconds_per_library(problem, t.threads, 5)) {
    t.flops_per_s[library] = problem.flops() / seconds;
  }
  return t;
}

double predicted_step_seconds(const TrainConfig& config, const ProbeResult& probe, int cores) {
  const TrainConfig c = resolved(config);
  // The optimizer's part grows with the parameters, the rest with the FLOPs: on a slice of a
  // large-vocabulary model the optimizer over the embedding is much of the probe's step, and
  // scaling it by the FLOPs predicted GPT-2 124M's step 2.3× too long.
  // The fastest probe step: noise only adds time, and a prediction taken on a busy machine
  // refused runs that then trained well within the deadline.
  const double probe_step_s = probe.layout.fastest_step_ms() / 1e3;
  const double optimizer_s =
      probe.layout.step_optimizer_ms.empty()
          ? 0.0
          : std::min(probe_step_s, probe.layout.fastest_step_optimizer_ms() / 1e3);
  const double flops_scale = flops_per_step(c) / flops_per_step(probe.config);
  const double parameter_scale =
      double(model_parameters(c.model)) / double(model_parameters(probe.config.model));
  // The probe gave each rank one thread, sharing the cores when its ranks outnumber them.
  const int world = world_of(c);
  cores = std::max(1, cores);
  const double probe_share = std::min(1.0, double(cores) / double(world));
  const int threads = c.threads > 0 ? c.threads : std::max(1, cores / world);
  const double scaled = (probe_step_s - optimizer_s) * flops_scale + optimizer_s * parameter_scale;
  return scaled * probe_share / double(threads);
}

const std::vector<DoctorCheck>& doctor_checks() {
  static const std::vector<DoctorCheck> checks = {
      {"timeouts", "Collective timeouts vs the step", false, check_timeouts},
      {"cores", "Ranks, threads and cores", false, check_cores},
      {"gemm-library", "GEMM library for the run's shapes", false, check_gemm_library},
      {"memory", "Memory headroom", false, check_memory},
      {"batch", "Global batch and LR schedule", false, check_batch},
      {"checkpoint", "Checkpoint against the config", false, check_checkpoint},
      {"attention-tp", "Attention vs tensor parallelism", false, check_attention_tp},
      {"checkpoint-dir", "Checkpoint directory", false, check_checkpoint_dir},
      {"dtype-load", "dtype on load", false, check_dtype_load},
      {"recompute", "Recompute vs tensor parallelism", true, check_recompute},
      {"replicas", "Diverging master weights", true, check_replicas},
      {"sharding", "Sharding that does not shard", true, check_sharding},
      {"network", "Network flow control and stalled links", true, check_network},
      {"overlap", "Gradient reduction and pipeline sends behind compute", true, check_overlap},
      {"grad-norm", "Local instead of global grad norm", true, check_grad_norm},
  };
  return checks;
}

std::vector<CheckResult> run_checks(const DoctorInput& input) {
  std::vector<CheckResult> results;
  for (const DoctorCheck& check : doctor_checks()) {
    CheckResult result = check.run(input);
    result.id = check.id;
    result.title = check.title;
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace lattice::doctor
