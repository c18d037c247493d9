// `lattice plan --validate`: for a small model and a list of layouts that fit this machine,
// the planner's prediction (plan/, a pure function) next to a real run of each layout
// (train/layout_run.h: a few steps on in-process ranks, rank 0's arena peaks per category and
// the median step time). Example:
//   lattice plan --validate --model gpt2-tiny --cluster runs/cpu-profile.json
#include "cli/plan_validate_command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/philox.h"
#include "core/thread_budget.h"
#include "data/token_file.h"
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

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five;
  in >> one >> five;
  return in ? fmt::format("{} (1 min) {} (5 min) on {} cores", one, five, available_cores())
            : "unknown";
}

plan::MeasuredRun measured_run(const LayoutRunResult& run) {
  const MemoryStats& m = run.finished;
  auto peak = [&](MemoryCategory c) { return double(m.peak_by_category[size_t(c)]); };
  return {.parameters = peak(MemoryCategory::kParameters),
          .gradients = peak(MemoryCategory::kGradients),
          .optimizer_states = peak(MemoryCategory::kOptimizerState),
          .activations = peak(MemoryCategory::kActivations),
          .other = peak(MemoryCategory::kWorkspace) + peak(MemoryCategory::kCommunication) +
                   peak(MemoryCategory::kOther),
          .total = double(m.peak_bytes),
          .step_seconds = run.median_step_ms() / 1e3};
}

}  // namespace

plan::ModelSpec plan_model_spec(const ModelConfig& c, int64_t tp) {
  plan::ModelSpec spec;
  spec.name = c.name;
  spec.n_layers = c.n_layer;
  spec.n_heads = c.n_head;
  spec.n_kv_heads = c.n_kv_head;
  spec.d_model = c.d_model;
  spec.d_ff = c.d_ff;
  spec.vocab_size = c.vocab_size;
  spec.padded_vocab_size = (c.vocab_size + tp - 1) / tp * tp;
  spec.max_seq_len = c.seq_len;
  spec.norm =
      c.norm == NormKind::kLayerNorm ? plan::NormKind::kLayerNorm : plan::NormKind::kRmsNorm;
  spec.position = c.position == PositionKind::kLearned ? plan::PositionKind::kLearned
                                                       : plan::PositionKind::kRope;
  spec.mlp = c.mlp == MlpKind::kGelu ? plan::MlpKind::kGelu : plan::MlpKind::kSwiglu;
  spec.biases = c.bias;
  spec.tied_embeddings = c.tied_embeddings;
  spec.fused_qkv = c.family == ModelFamily::kGpt2;
  plan::validate(spec);
  return spec;
}

int run_plan_validate(const PlanValidateArgs& args) {
  const TrainConfig base = validation_config(args);
  const ResolvedCluster cluster = resolve_validation_cluster(args.cluster);
  std::optional<SyntheticData> synthetic;
  if (args.data.empty()) synthetic.emplace(base.model);
  const std::filesystem::path data =
      synthetic ? synthetic->dir() : std::filesystem::path(args.data);
  plan::ValidationTolerance tolerance;
  tolerance.time_factor = args.time_factor;

  if (!args.json) {
    fmt::print(
        "# lattice plan --validate: {} (compute {}), global batch {} x T={}, {} warm-up + {} "
        "timed steps, {} thread(s) per rank\n",
        base.model.name, args.precision, base.global_batch, base.seq_len, args.warmup, args.steps,
        args.threads);
    fmt::print("# cluster: {}\n", cluster.source);
    fmt::print("# load average at start: {} (step times on a loaded machine run long)\n",
               load_average());
    fmt::print(
        "# memory: planner (runtime model 'lattice') vs rank 0's arena peak per category; "
        "time: predicted step vs median measured step\n");
  }
  // Every layout is checked before anything runs.
  std::vector<plan::Layout> layouts;
  for (const std::string& text : args.layouts) {
    plan::Layout layout = plan::parse_validation_layout(text);
    if (layout.devices() * args.threads > available_cores()) {
      LATTICE_THROW(ConfigError,
                    "layout {} needs {} ranks x {} thread(s) but this machine has {} cores ---> "
                    "HINT: drop it from --layouts or lower --threads (no oversubscription)",
                    text, layout.devices(), args.threads, available_cores());
    }
    if (base.global_batch % layout.dp != 0) {
      LATTICE_THROW(ConfigError,
                    "--global-batch {} does not split over dp {} of layout {} ---> HINT: use a "
                    "multiple of {}",
                    base.global_batch, layout.dp, text, layout.dp);
    }
    layout.micro_batch = base.global_batch / layout.dp;
    layouts.push_back(layout);
  }

  std::vector<plan::LayoutValidation> results;
  for (const plan::Layout& layout : layouts) {
    const std::string text = plan::validation_layout_name(layout);
    plan::TrainingSetup setup;
    setup.model = plan_model_spec(base.model, layout.tp);
    setup.cluster = cluster.spec;
    setup.devices = layout.devices();
    setup.global_batch = base.global_batch;
    setup.seq_len = base.seq_len;
    setup.precision =
        base.compute_dtype == DType::kBF16 ? plan::Precision::kBf16 : plan::Precision::kFp32;
    setup.fp32_gradients = true;
    setup.runtime = plan::Runtime::kLattice;
    plan::validate(setup);
    if (auto rejection = plan::check_layout(setup, layout)) {
      LATTICE_THROW(ConfigError, "the planner rejects layout {}: {}", text, rejection->message);
    }
    const plan::MemoryBreakdown memory = plan::estimate_memory(setup, layout);
    const plan::TimeBreakdown time = plan::estimate_time(setup, layout);
    // For reference: the activations of Korthikanti et al.'s model (the planner's default).
    plan::TrainingSetup paper_setup = setup;
    paper_setup.runtime = plan::Runtime::kMegatron;
    const plan::MemoryBreakdown paper = plan::estimate_memory(paper_setup, layout);
    const double paper_activations =
        paper.activations + paper.recompute_working + paper.embedding_activations + paper.logits;

    TrainConfig config = base;
    config.data_dir = data.string();
    const LayoutRunResult run = run_layout(config, {.dp = int(layout.dp),
                                                    .tp = int(layout.tp),
                                                    .sequence_parallel = layout.sequence_parallel,
                                                    .zero = layout.zero,
                                                    .threads = args.threads,
                                                    .warmup_steps = args.warmup,
                                                    .steps = args.steps});
    results.push_back(plan::compare_layout(plan::validation_layout_name(layout), layout, memory,
                                           time, measured_run(run), tolerance));
    if (!args.json) {
      const plan::MeasuredRun& measured = results.back().measured;
      fmt::print(
          "# {}: micro-batch {}; store {} elements ({} with 16-element alignment), "
          "optimizer range {}; Korthikanti activations {:.1f} KiB ({:.2f} of measured)\n",
          results.back().name, layout.micro_batch, run.unpadded_elements, run.store_elements,
          run.optimizer_elements, paper_activations / 1024.0,
          paper_activations / measured.activations);
      fmt::print(
          "#   predicted ms: forward {:.2f} backward {:.2f} tp {:.2f} dp exposed {:.2f} "
          "(of {:.2f}) optimizer {:.2f}; measured ms:",
          time.forward * 1e3, time.backward * 1e3, time.tp_communication * 1e3,
          time.dp_communication * 1e3, time.dp_communication_total * 1e3, time.optimizer * 1e3);
      for (double ms : run.step_ms) fmt::print(" {:.1f}", ms);
      fmt::print("\n");
    }
  }

  int flagged = 0;
  for (const plan::LayoutValidation& v : results) flagged += v.flagged_count();
  if (args.json) {
    nlohmann::json out = {{"model", base.model.name},          {"precision", args.precision},
                          {"global_batch", base.global_batch}, {"seq_len", base.seq_len},
                          {"cluster", cluster.source},         {"calibrated", cluster.calibrated},
                          {"layouts", nlohmann::json::array()}};
    for (const plan::LayoutValidation& v : results) out["layouts"].push_back(plan::to_json(v));
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("{}", plan::format_validation(results));
    fmt::print("# {} of {} rows out of tolerance\n", flagged,
               results.size() * (results.empty() ? 0 : results.front().rows.size()));
  }
  return flagged;
}

}  // namespace lattice::cli
