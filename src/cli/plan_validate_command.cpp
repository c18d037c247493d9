// `lattice plan --validate`: for a small model and a list of layouts that fit this machine,
// the planner's prediction (plan/, a pure function) next to a real run of each layout
// (train/layout_run.h: a few steps on in-process ranks, rank 0's arena peaks per category and
// the median step time). Example:
//   lattice plan --validate --model gpt2-tiny --cluster runs/cpu-profile.json
#include "cli/plan_validate_command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/bench_util.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/thread_budget.h"
#include "data/token_file.h"
#include "forecast/forecast.h"
#include "plan/cluster_profile.h"
#include "plan/evaluation.h"
#include "plan/validation.h"
#include "train/layout_run.h"

namespace lattice::cli {
namespace {

// Where `lattice bench calibrate` writes in docs/planner.md's example; used when --cluster is
// not given and the file exists.
constexpr const char* kDefaultProfile = "runs/cpu-profile.json";

struct ResolvedCluster {
  plan::ClusterSpec spec;
  std::string source;  // what the report says about it
  bool calibrated = false;
};

ResolvedCluster resolve_validation_cluster(const std::string& requested) {
  if (!requested.empty()) {
    plan::ClusterSpec spec = plan::resolve_cluster(requested);
    const bool calibrated = !spec.gemm.empty();
    return {std::move(spec), fmt::format("--cluster {}", requested), calibrated};
  }
  if (std::filesystem::exists(kDefaultProfile)) {
    return {plan::load_cluster_profile(kDefaultProfile),
            fmt::format("{} (the default profile; written by `lattice bench calibrate`)",
                        kDefaultProfile),
            true};
  }
  return {plan::cluster_preset("dgx-h100"),
          fmt::format("dgx-h100, the planner's default preset: NOT this machine, so the step-time "
                      "ratios mean nothing ---> HINT: `lattice bench calibrate --out {}` first",
                      kDefaultProfile),
          false};
}

TrainConfig validation_config(const PlanValidateArgs& args) {
  TrainConfig config;
  if (args.model.ends_with(".toml")) {
    config = load_train_config(args.model);
  } else {
    config.model = model_preset(args.model);
  }
  if (args.precision != "fp32" && args.precision != "bf16") {
    LATTICE_THROW(ConfigError, "--precision {} ---> HINT: fp32 or bf16", args.precision);
  }
  if (args.layers > 0) config.model.n_layer = args.layers;
  config.model.validate();
  config.compute_dtype = args.precision == "bf16" ? DType::kBF16 : DType::kF32;
  config.seq_len = args.seq > 0 ? args.seq : config.model.seq_len;
  config.global_batch = args.global_batch;
  config.micro_batches = 1;
  config.micro_batch = 0;  // global_batch / dp, resolved per layout
  config.steps = args.warmup + args.steps;
  config.threads = args.threads;
  return config;
}

// Synthetic tokens in a directory of this process, removed on exit: what the tokens are
// changes neither the memory nor the time of a step.
class SyntheticData {
 public:
  explicit SyntheticData(const ModelConfig& model)
      : dir_(std::filesystem::temp_directory_path() /
             fmt::format("lattice_plan_validate_{}", getpid())) {
    std::filesystem::create_directories(dir_);
    std::vector<int32_t> tokens(1 << 16);
    PhiloxStream rng(2026, 9);
    for (int32_t& t : tokens) t = int32_t(rng.next_below(uint64_t(model.vocab_size)));
    write_token_file(dir_ / "train.bin", tokens);
  }
  ~SyntheticData() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  SyntheticData(const SyntheticData&) = delete;
  SyntheticData& operator=(const SyntheticData&) = delete;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

plan::MeasuredRun measured_run(const RankRun& rank, double step_seconds) {
  const MemoryStats& m = rank.finished;
  auto peak = [&](MemoryCategory c) { return double(m.peak_by_category[size_t(c)]); };
  return {.parameters = peak(MemoryCategory::kParameters),
          .gradients = peak(MemoryCategory::kGradients),
          .optimizer_states = peak(MemoryCategory::kOptimizerState),
          .activations = peak(MemoryCategory::kActivations),
          .other = peak(MemoryCategory::kWorkspace) + peak(MemoryCategory::kCommunication) +
                   peak(MemoryCategory::kOther),
          .total = double(m.peak_bytes),
          .step_seconds = step_seconds};
}

}  // namespace

int run_plan_validate(const PlanValidateArgs& args) {
  const TrainConfig base = validation_config(args);
  const ResolvedCluster cluster = resolve_validation_cluster(args.cluster);
  std::optional<SyntheticData> synthetic;
  if (args.data.empty()) synthetic.emplace(base.model);
  const std::filesystem::path data =
      synthetic ? synthetic->dir() : std::filesystem::path(args.data);
  plan::ValidationTolerance tolerance;
  tolerance.time_factor = args.time_factor;
  if (args.rounds < 1 || args.micro_batches < 1) {
    LATTICE_THROW(ConfigError, "--rounds {} --micro-batches {} ---> HINT: both at least 1",
                  args.rounds, args.micro_batches);
  }

  const std::string machine_at_start = cli::machine_state();
  if (!args.json) {
    fmt::print(
        "# lattice plan --validate: {} ({} layers, compute {}), global batch {} x T={}, {} "
        "warm-up + {} timed steps x {} round(s), {} thread(s) per rank\n",
        base.model.name, base.model.n_layer, args.precision, base.global_batch, base.seq_len,
        args.warmup, args.steps, args.rounds, args.threads);
    fmt::print("# cluster: {}\n", cluster.source);
    fmt::print("# machine at start: {} (step times on a loaded machine run long)\n",
               machine_at_start);
    fmt::print(
        "# memory: planner (runtime model 'lattice') vs the arena peak per category of the most "
        "loaded pipeline stage's rank (dp 0, tp 0); time: predicted step vs median measured "
        "step\n");
  }
  // Every layout is checked before anything runs.
  struct Planned {
    plan::Layout layout;
    plan::TrainingSetup setup;
  };
  std::vector<Planned> planned;
  for (const std::string& text : args.layouts) {
    plan::Layout layout = plan::parse_validation_layout(text);
    if (layout.devices() * args.threads > available_cores() && !args.oversubscribe) {
      LATTICE_THROW(ConfigError,
                    "layout {} needs {} ranks x {} thread(s) but this machine has {} cores ---> "
                    "HINT: drop it from --layouts, lower --threads, or pass --oversubscribe to "
                    "validate its memory (its step time then measures the contention)",
                    text, layout.devices(), args.threads, available_cores());
    }
    const int64_t m = layout.pp > 1 ? args.micro_batches : 1;
    if (layout.micro_batch == 0) layout.micro_batch = base.global_batch / (layout.dp * m);
    if (layout.micro_batch < 1 || base.global_batch % (layout.dp * layout.micro_batch) != 0) {
      LATTICE_THROW(ConfigError,
                    "--global-batch {} does not split into micro-batches over dp {} of layout {} "
                    "---> HINT: use a multiple of dp x micro-batches = {}",
                    base.global_batch, layout.dp, text, layout.dp * m);
    }
    const plan::TrainingSetup setup = plan_setup(base, layout, cluster.spec);
    if (auto rejection = plan::check_layout(setup, layout)) {
      LATTICE_THROW(ConfigError, "the planner rejects layout {}: {}", text, rejection->message);
    }
    planned.push_back({layout, std::move(setup)});
  }

  // Rounds over the whole list, so that a burst of load on the shared machine spreads over the
  // layouts instead of landing on one; memory from the first round (it does not vary).
  std::vector<LayoutRunResult> runs(planned.size());
  std::vector<std::vector<double>> step_ms(planned.size()), step_cpu_ms(planned.size());
  for (int round = 0; round < args.rounds; ++round) {
    for (size_t i = 0; i < planned.size(); ++i) {
      const plan::Layout& layout = planned[i].layout;
      TrainConfig config = base;
      config.data_dir = data.string();
      config.micro_batch = layout.micro_batch;
      config.micro_batches = plan::micro_batches(layout, base.global_batch);
      LayoutRunResult run = run_layout(config, {.layout = runtime_layout(layout),
                                                .threads = args.threads,
                                                .warmup_steps = args.warmup,
                                                .steps = args.steps});
      step_ms[i].insert(step_ms[i].end(), run.step_ms.begin(), run.step_ms.end());
      step_cpu_ms[i].insert(step_cpu_ms[i].end(), run.step_cpu_ms.begin(), run.step_cpu_ms.end());
      if (round == 0) runs[i] = std::move(run);
    }
  }

  std::vector<plan::LayoutValidation> results;
  for (size_t i = 0; i < planned.size(); ++i) {
    const plan::Layout& layout = planned[i].layout;
    const plan::TrainingSetup& setup = planned[i].setup;
    const LayoutRunResult& run = runs[i];
    const plan::TimeBreakdown time = plan::estimate_time(setup, layout);
    // The stage whose rank (dp 0, tp 0) peaked highest, and the planner's figures for it.
    int stage = 0;
    std::vector<plan::MemoryBreakdown> predicted;
    for (int s = 0; s < int(layout.pp); ++s) {
      predicted.push_back(plan::estimate_stage_memory(setup, layout, s));
      if (run.stage(s).finished.peak_bytes > run.stage(stage).finished.peak_bytes) stage = s;
    }
    const plan::MemoryBreakdown planner_peak = plan::estimate_memory(setup, layout);
    std::string name = plan::validation_layout_name(layout);
    if (layout.pp > 1) name += fmt::format(" @s{}", stage);
    // More ranks than cores: the step time measures the contention (marked, still judged).
    if (layout.devices() * args.threads > available_cores()) name += " (over)";
    results.push_back(plan::compare_layout(name, layout, predicted[size_t(stage)], time,
                                           measured_run(run.stage(stage), median(step_ms[i]) / 1e3),
                                           tolerance));
    results.back().stage = stage;
    if (layout.pp > 1) {
      double measured_peak = 0;
      for (const RankRun& rank : run.ranks)
        measured_peak = std::max(measured_peak, double(rank.finished.peak_bytes));
      plan::add_peak_over_stages(results.back(), planner_peak.total - planner_peak.fragmentation,
                                 measured_peak, tolerance.total);
    }
    if (args.json) continue;
    // For reference: the activations of Korthikanti et al.'s model (the planner's default).
    plan::TrainingSetup paper_setup = setup;
    paper_setup.runtime = plan::Runtime::kMegatron;
    const plan::MemoryBreakdown paper = plan::estimate_stage_memory(paper_setup, layout, stage);
    const double paper_activations =
        paper.activations + paper.recompute_working + paper.embedding_activations + paper.logits;
    const plan::MeasuredRun& measured = results.back().measured;
    fmt::print(
        "# {}: micro-batch {} x {}; store {} elements ({} with 16-element alignment), optimizer "
        "range {}; Korthikanti activations {:.1f} KiB ({:.2f} of measured)\n",
        results.back().name, layout.micro_batch, plan::micro_batches(layout, setup.global_batch),
        run.stage(stage).unpadded_elements, run.stage(stage).store_elements,
        run.stage(stage).optimizer_elements, paper_activations / 1024.0,
        paper_activations / measured.activations);
    if (layout.pp > 1) {
      fmt::print("#   total KiB per stage, predicted/measured:");
      for (int s = 0; s < int(layout.pp); ++s) {
        fmt::print(" s{} {:.1f}/{:.1f}", s,
                   (predicted[size_t(s)].total - predicted[size_t(s)].fragmentation) / 1024.0,
                   double(run.stage(s).finished.peak_bytes) / 1024.0);
      }
      fmt::print("; planner's most loaded stage s{}\n", planner_peak.stage);
    }
    std::vector<double> sorted = step_ms[i];
    std::sort(sorted.begin(), sorted.end());
    fmt::print(
        "#   predicted ms: forward {:.2f} backward {:.2f} recompute {:.2f} tp {:.2f} pp {:.2f} "
        "bubble {:.2f} dp exposed {:.2f} (of {:.2f}) sync {:.2f} optimizer {:.2f}; measured ms "
        "({} steps): min {:.2f} median {:.2f} max {:.2f}; rank 0's thread CPU time median {:.2f} "
        "(predicted / CPU {:.3f})\n",
        time.forward * 1e3, time.backward * 1e3, time.recompute * 1e3, time.tp_communication * 1e3,
        time.pp_communication * 1e3, time.bubble * 1e3, time.dp_communication * 1e3,
        time.dp_communication_total * 1e3, time.synchronisation * 1e3, time.optimizer * 1e3,
        sorted.size(), sorted.front(), median(sorted), sorted.back(), median(step_cpu_ms[i]),
        time.step * 1e3 / median(step_cpu_ms[i]));
  }

  int flagged = 0;
  for (const plan::LayoutValidation& v : results) flagged += v.flagged_count();
  size_t rows = 0;
  for (const plan::LayoutValidation& v : results) rows += v.rows.size();
  if (args.json) {
    nlohmann::json out = {
        {"model", base.model.name},          {"layers", base.model.n_layer},
        {"precision", args.precision},       {"global_batch", base.global_batch},
        {"seq_len", base.seq_len},           {"cluster", cluster.source},
        {"calibrated", cluster.calibrated},  {"machine_at_start", machine_at_start},
        {"machine_at_end", machine_state()}, {"layouts", nlohmann::json::array()}};
    for (size_t i = 0; i < results.size(); ++i) {
      nlohmann::json layout = plan::to_json(results[i]);
      layout["step_cpu_seconds"] = median(step_cpu_ms[i]) / 1e3;  // rank 0's thread CPU time
      out["layouts"].push_back(std::move(layout));
    }
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("{}", plan::format_validation(results));
    fmt::print(
        "# step time: predicted, measured wall median (min-max), rank 0's thread CPU median "
        "(its compute without blocked or descheduled time)\n");
    for (size_t i = 0; i < results.size(); ++i) {
      const std::vector<double>& wall = step_ms[i];
      fmt::print(
          "#   {:<24} {:8.2f} ms  wall {:8.2f} ({:.2f}-{:.2f}) ratio {:.3f}  cpu {:8.2f} ratio "
          "{:.3f}\n",
          results[i].name, results[i].predicted_time.step * 1e3, median(wall),
          *std::min_element(wall.begin(), wall.end()), *std::max_element(wall.begin(), wall.end()),
          results[i].predicted_time.step * 1e3 / median(wall), median(step_cpu_ms[i]),
          results[i].predicted_time.step * 1e3 / median(step_cpu_ms[i]));
    }
    fmt::print("# {} of {} rows out of tolerance; machine at end: {}\n", flagged, rows,
               machine_state());
  }
  return flagged;
}

}  // namespace lattice::cli
