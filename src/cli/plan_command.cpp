// `lattice plan`: recommends a parallel layout for a model on a cluster and predicts its memory
// and step time (plan/). Example:
//   lattice plan --model llama-3-70b --cluster dgx-h100 --nodes 128 --global-batch 1024 --seq 4096
// Fixing every dimension evaluates that one layout:
//   ... --tp 8 --pp 8 --dp 16 --micro-batch 1 --virtual-stages 5 --recompute selective --sp
// --validate runs small layouts on this machine and compares (cli/plan_validate_command.h):
//   lattice plan --validate --model gpt2-tiny --cluster runs/cpu-profile.json
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/plan_validate_command.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/timer.h"
#include "plan/alternatives.h"
#include "plan/model_presets.h"
#include "plan/plan_report.h"
#include "plan/search.h"

namespace lattice::cli {

namespace {

struct PlanArgs {
  std::string model;
  std::string headroom;  // "10%" or "10": percent of each device's usable memory kept free
  std::string cluster = "dgx-h100";
  int64_t nodes = 1;
  int64_t gpus = 0;  // overrides nodes × gpus_per_node
  int64_t global_batch = 0;
  int64_t seq = 0;  // 0: the model's max_seq_len
  std::string precision = "bf16";
  bool fp32_grads = false;
  bool dropout = false;
  bool materialized_attention = false;
  // Constraints; 0 / empty: searched.
  int64_t dp = 0, tp = 0, pp = 0, virtual_stages = 0, micro_batch = 0, cp = 0, ep = 0;
  int64_t max_pp = 0, max_micro_batch = 16;
  std::vector<int64_t> layers_per_chunk;  // a pipeline split: p·v layer counts
  std::vector<std::string> recompute;
  std::vector<int> zero;
  std::vector<std::string> schedule;
  bool sp = false, no_sp = false;
  int top = 5;
  bool json = false;
  // Energy and cost: prices over the cluster's (0: the cluster's own, none in the presets), the
  // run's length in tokens, what to minimise, and the time the run must fit in.
  double price_gpu_hour = 0, price_kwh = 0;
  double tokens = 0;
  std::string optimize = "time";
  std::string deadline;
  // --validate (its defaults differ: the model shakespeare-char, a batch of 8, fp32, the default
  // profile; see plan_validate_command.h).
  bool validate = false;
  PlanValidateArgs validation;
  // --validate-published: the planner against the published runs' step times
  // (plan/published_runs.h).
  bool validate_published = false;
};

std::optional<int64_t> fixed(int64_t value) {
  return value > 0 ? std::optional<int64_t>(value) : std::nullopt;
}

// "10%" or "10" -> 0.10; empty -> 0.
double parse_headroom(const std::string& text) {
  if (text.empty()) return 0.0;
  std::string number = text.ends_with('%') ? text.substr(0, text.size() - 1) : text;
  size_t used = 0;
  double percent = -1;
  try {
    percent = std::stod(number, &used);
  } catch (const std::exception&) {
  }
  if (used != number.size() || number.empty() || !(percent >= 0 && percent < 100)) {
    LATTICE_THROW(ConfigError,
                  "--headroom '{}' is not a percentage in [0, 100) ---> HINT: --headroom 10% "
                  "keeps a tenth of each device's memory free",
                  text);
  }
  return percent / 100.0;
}

// "30d", "720h" or "720" (hours) -> hours; empty -> 0.
double parse_deadline_hours(const std::string& text) {
  if (text.empty()) return 0.0;
  const double unit = text.ends_with('d') ? 24.0 : 1.0;
  const std::string number =
      text.ends_with('d') || text.ends_with('h') ? text.substr(0, text.size() - 1) : text;
  size_t used = 0;
  double value = -1;
  try {
    value = std::stod(number, &used);
  } catch (const std::exception&) {
  }
  if (number.empty() || used != number.size() || !(value > 0)) {
    LATTICE_THROW(ConfigError,
                  "--deadline '{}' is not a duration ---> HINT: --deadline 30d (days) or 720h "
                  "(hours)",
                  text);
  }
  return value * unit;
}

// --deadline: the search at each device count up to the one given (whole nodes), the layouts
// that train the token budget in time kept, the best of them by the objective chosen.
void search_within_deadline(plan::PlanOutcome& outcome,
                            const plan::SearchConstraints& constraints) {
  const plan::TrainingSetup given = outcome.setup;
  const int64_t per_node = std::max<int64_t>(given.cluster.gpus_per_node, 1);
  std::vector<int64_t> counts;
  for (int64_t d = per_node; d <= given.devices; d += per_node) counts.push_back(d);
  if (counts.empty() || counts.back() != given.devices) counts.push_back(given.devices);
  std::optional<double> best_value, fastest_hours;
  for (int64_t devices : counts) {
    plan::TrainingSetup setup = given;
    setup.devices = devices;
    plan::SearchResult result;
    try {
      result = plan::search_layouts(setup, constraints);
    } catch (const ConfigError&) {
      continue;  // a fixed size that does not divide this count
    }
    std::vector<plan::Evaluation> in_time;
    for (const plan::Evaluation& e : result.ranked) {
      const double hours = outcome.token_budget / e.time.tokens_per_second / 3600.0;
      if (!fastest_hours || hours < *fastest_hours) fastest_hours = hours;
      if (hours <= outcome.deadline_hours) in_time.push_back(e);
    }
    if (in_time.empty()) continue;
    const double value =
        plan::objective_per_token(constraints.objective, setup, in_time.front().time);
    if (best_value && value >= *best_value) continue;
    best_value = value;
    result.ranked = std::move(in_time);
    outcome.setup = setup;
    outcome.search = std::move(result);
  }
  if (!best_value) {
    LATTICE_THROW(ConfigError,
                  "no layout trains {:.3g} tokens within {:.1f} days on up to {} devices{} ---> "
                  "HINT: add devices (--nodes), allow more time, or train fewer tokens",
                  outcome.token_budget, outcome.deadline_hours / 24, given.devices,
                  fastest_hours
                      ? fmt::format(" (the fastest takes {:.1f} days)", *fastest_hours / 24)
                      : std::string());
  }
}

void run_validate_published(const PlanArgs& args) {
  const plan::PublishedValidation validation = plan::validate_published(plan::published_runs());
  if (args.json) {
    fmt::print("{}\n", plan::to_json(validation).dump(2));
  } else {
    fmt::print("{}", plan::format_published(validation));
  }
}

void run_plan(const PlanArgs& args) {
  if (args.model.empty() || args.global_batch <= 0) {
    LATTICE_THROW(ConfigError,
                  "lattice plan needs --model and --global-batch ---> HINT: e.g. --model "
                  "llama-3-70b --global-batch 1024 (or --validate to compare with real runs)");
  }
  plan::TrainingSetup setup;
  setup.model = plan::resolve_model(args.model);
  setup.cluster = plan::resolve_cluster(args.cluster);
  setup.devices = args.gpus > 0 ? args.gpus : args.nodes * setup.cluster.gpus_per_node;
  setup.global_batch = args.global_batch;
  setup.seq_len = args.seq > 0 ? args.seq : setup.model.max_seq_len;
  setup.precision = plan::parse_precision(args.precision);
  setup.fp32_gradients = args.fp32_grads;
  setup.dropout = args.dropout;
  setup.flash_attention = !args.materialized_attention;
  setup.memory_headroom = parse_headroom(args.headroom);
  if (args.price_gpu_hour < 0 || args.price_kwh < 0 || args.tokens < 0) {
    LATTICE_THROW(ConfigError,
                  "--price-gpu-hour, --price-kwh and --tokens cannot be negative ---> HINT: e.g. "
                  "--price-gpu-hour 2.5 --tokens 1e12");
  }
  if (args.price_gpu_hour > 0) setup.cluster.price.per_device_hour = args.price_gpu_hour;
  if (args.price_kwh > 0) setup.cluster.price.per_kwh = args.price_kwh;

  plan::SearchConstraints constraints;
  constraints.dp = fixed(args.dp);
  constraints.tp = fixed(args.tp);
  constraints.cp = fixed(args.cp);
  constraints.ep = fixed(args.ep);
  constraints.pp = fixed(args.pp);
  constraints.virtual_stages = fixed(args.virtual_stages);
  constraints.micro_batch = fixed(args.micro_batch);
  constraints.max_pp = args.max_pp;
  constraints.max_micro_batch = args.max_micro_batch;
  constraints.layers_per_chunk = args.layers_per_chunk;
  constraints.top_k = args.top;
  if (args.sp && args.no_sp) {
    LATTICE_THROW(ConfigError, "--sp and --no-sp contradict each other ---> HINT: give one");
  }
  if (args.sp) constraints.sequence_parallel = true;
  if (args.no_sp) constraints.sequence_parallel = false;
  if (!args.recompute.empty()) {
    constraints.recompute.clear();
    for (const std::string& r : args.recompute) {
      constraints.recompute.push_back(plan::parse_recompute(r));
    }
  }
  if (!args.zero.empty()) constraints.zero_stages = args.zero;
  if (!args.schedule.empty()) {
    constraints.schedules.clear();
    for (const std::string& s : args.schedule) {
      constraints.schedules.push_back(parse_schedule_kind(s));
    }
  }

  constraints.objective = plan::parse_objective(args.optimize);
  if (constraints.objective == plan::Objective::kCost && setup.cluster.price.per_device_hour <= 0 &&
      setup.cluster.price.per_kwh <= 0) {
    LATTICE_THROW(ConfigError,
                  "--optimize cost needs a price ---> HINT: --price-gpu-hour 2.5 (a rented "
                  "device, power included) and/or --price-kwh 0.12 (power paid apart), or a "
                  "cluster profile's \"price\"");
  }

  plan::PlanOutcome outcome;
  outcome.setup = setup;
  outcome.objective = constraints.objective;
  outcome.token_budget = args.tokens;
  outcome.deadline_hours = parse_deadline_hours(args.deadline);
  outcome.devices_given = setup.devices;
  Stopwatch watch;
  if (outcome.deadline_hours > 0) {
    if (args.tokens <= 0) {
      LATTICE_THROW(ConfigError,
                    "--deadline {} needs the run's length ---> HINT: --tokens 1e12 (the tokens to "
                    "train)",
                    args.deadline);
    }
    search_within_deadline(outcome, constraints);
  } else {
    outcome.search = plan::search_layouts(setup, constraints);
  }
  outcome.search_seconds = watch.seconds();
  if (!outcome.search.ranked.empty()) {
    // Against the device count the recommendation uses (--deadline may choose fewer than given).
    outcome.alternatives = plan::explain_alternatives(outcome.setup, outcome.search.ranked.front());
  }

  if (args.json) {
    fmt::print("{}\n", plan::to_json(outcome).dump(2));
  } else {
    fmt::print("{}", plan::format_report(outcome));
  }
  if (outcome.search.ranked.empty()) {
    LATTICE_THROW(ConfigError,
                  "no layout of {} on {} devices passes ---> HINT: the report above names "
                  "why; relax the constraints or add devices",
                  setup.model.name, setup.devices);
  }
}

}  // namespace

void register_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Recommend a parallel layout and predict its memory and step time");
  CLI::Option* model = cmd->add_option("--model", args->model,
                                       "Model preset or config file (.toml, HF config.json)");
  CLI::Option* cluster =
      cmd->add_option("--cluster", args->cluster,
                      "Cluster preset (dgx-a100, dgx-h100) or profile JSON from `bench calibrate`")
          ->capture_default_str();
  cmd->add_option("--nodes", args->nodes, "Nodes")->capture_default_str();
  cmd->add_option("--gpus", args->gpus, "Devices in all (overrides --nodes)");
  CLI::Option* global_batch =
      cmd->add_option("--global-batch", args->global_batch, "Sequences per optimizer step");
  cmd->add_option("--seq", args->seq, "Sequence length (default: the model's)");
  CLI::Option* precision = cmd->add_option("--precision", args->precision, "bf16 (mixed) or fp32")
                               ->capture_default_str();
  cmd->add_flag("--fp32-grads", args->fp32_grads, "Accumulate gradients in fp32");
  cmd->add_flag("--dropout", args->dropout, "Count dropout masks (Lattice's blocks have none)");
  cmd->add_flag("--materialized-attention", args->materialized_attention,
                "Attention stores the s×s scores (Lattice's kernel is flash-style)");
  cmd->add_option("--dp", args->dp, "Fix data-parallel size");
  cmd->add_option("--tp", args->tp, "Fix tensor-parallel size");
  cmd->add_option("--cp", args->cp,
                  "Fix context-parallel size (each sequence over cp ranks; default: searched "
                  "down to 4096 positions a rank)");
  cmd->add_option("--ep", args->ep,
                  "Fix expert-parallel size (a mixture-of-experts model's experts over ep of the "
                  "dp ranks; default: searched over the sizes dividing dp and the experts)");
  cmd->add_option("--pp", args->pp, "Fix pipeline-parallel size");
  cmd->add_option("--virtual-stages", args->virtual_stages,
                  "Fix model chunks per pipeline rank (interleaved schedule)");
  cmd->add_option("--micro-batch", args->micro_batch, "Fix sequences per micro-batch");
  cmd->add_option("--max-pp", args->max_pp, "Largest pipeline size to consider");
  cmd->add_option("--layers-per-chunk", args->layers_per_chunk,
                  "Pipeline split for the layouts with that many chunks (p·v layer counts, e.g. "
                  "7,8,...,8,7); otherwise an even split, or the balanced partition where the "
                  "layers do not divide")
      ->delimiter(',');
  cmd->add_option("--max-micro-batch", args->max_micro_batch, "Largest micro-batch to consider")
      ->capture_default_str();
  cmd->add_option("--recompute", args->recompute, "Allowed recompute modes: none selective full");
  cmd->add_option("--zero", args->zero, "Allowed ZeRO stages (0-3)");
  cmd->add_option("--schedule", args->schedule,
                  "Allowed pipeline schedules: 1f1b interleaved-1f1b gpipe zb-h1");
  cmd->add_flag("--sp", args->sp, "Require sequence parallelism");
  cmd->add_flag("--no-sp", args->no_sp, "Forbid sequence parallelism");
  cmd->add_option("--top", args->top, "How many layouts to list")->capture_default_str();
  cmd->add_option("--headroom", args->headroom,
                  "Keep this share of each device's memory free, e.g. 10% (a layout must fit "
                  "in the rest)");
  cmd->add_option("--price-gpu-hour", args->price_gpu_hour,
                  "Money per device-hour (a rented device, power included): the report adds cost "
                  "per million tokens");
  cmd->add_option("--price-kwh", args->price_kwh, "Money per kWh of power paid apart");
  cmd->add_option("--tokens", args->tokens,
                  "The run's length in tokens (1e12): its time, energy and cost in the report");
  cmd->add_option("--optimize", args->optimize,
                  "What the ranking minimises per token: time, cost or energy")
      ->capture_default_str();
  cmd->add_option("--deadline", args->deadline,
                  "With --tokens: the best layout (by --optimize) that trains them within this "
                  "time (30d, 720h), on up to the devices given (fewer nodes are tried too)");
  cmd->add_flag("--json", args->json, "Print JSON instead of the report");

  PlanValidateArgs& v = args->validation;
  cmd->add_flag("--validate-published", args->validate_published,
                "Predict the published large-scale runs (Megatron-LM on A100, Llama 3 405B on "
                "H100) at their layouts; print predicted vs published step time and the error");
  cmd->add_flag("--validate", args->validate,
                "Run layouts of a small model here; compare predicted and measured memory and "
                "step time (model: a trainer preset or training .toml; default shakespeare-char)");
  cmd->add_option("--layouts", v.layouts,
                  "--validate: layouts, e.g. dp1tp1 dp2 tp2+sp dp2+zero1 rc-full pp2+gpipe pp2+v2 "
                  "pp2+zb (dp<N> tp<N> pp<N> zero<K> sp 1f1b|gpipe|zb|v<N> rc-sel|rc-full mb<N>)")
      ->capture_default_str();
  cmd->add_option("--layers", v.layers, "--validate: override the model's layer count")
      ->check(positive_number());
  cmd->add_option("--micro-batches", v.micro_batches,
                  "--validate: micro-batches per step of pipeline layouts (without mb<N>)")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--rounds", v.rounds,
                  "--validate: run the layout list this many times (step time: median of all)")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--steps", v.steps, "--validate: timed steps per layout")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--warmup", v.warmup, "--validate: untimed steps first")
      ->capture_default_str()
      ->check(non_negative_number());
  cmd->add_option("--threads", v.threads, "--validate: threads per rank")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--data", v.data, "--validate: directory with train.bin (default: synthetic)");
  cmd->add_flag("--oversubscribe", v.oversubscribe,
                "--validate: allow layouts with more ranks x threads than cores (memory only: "
                "their step time measures the contention; marked '(over)')");
  cmd->add_option("--time-factor", v.time_factor,
                  "--validate: step time accepted within this factor of the measurement")
      ->capture_default_str();
  cmd->callback([args, model, cluster, global_batch, precision] {
    if (args->validate_published) {
      run_validate_published(*args);
      return;
    }
    if (!args->validate) {
      run_plan(*args);
      return;
    }
    PlanValidateArgs v = args->validation;
    if (model->count() > 0) v.model = args->model;
    if (cluster->count() > 0) v.cluster = args->cluster;
    if (global_batch->count() > 0) v.global_batch = args->global_batch;
    if (precision->count() > 0) v.precision = args->precision;
    v.seq = args->seq;
    v.json = args->json;
    const int flagged = run_plan_validate(v);
    if (flagged > 0) {
      LATTICE_THROW(ValueError,
                    "{} predicted figure(s) are outside their tolerance ---> HINT: the table "
                    "above names them; docs/planner.md (Validation) says what the models leave out",
                    flagged);
    }
  });
}

}  // namespace lattice::cli
