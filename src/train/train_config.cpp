#include "train/train_config.h"

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "data/tokenizer.h"
#include "model/transformer.h"
#include "spec/pipeline_schedule.h"

namespace lattice {

namespace {

using Setter = std::function<void(TrainConfig&, const toml::node&, const std::string&)>;

std::string describe(const toml::node& node) {
  std::ostringstream out;
  if (auto* s = node.as_string()) return "\"" + s->get() + "\"";
  node.visit([&](auto&& n) { out << n; });
  return out.str();
}

int64_t get_int(const toml::node& node, const std::string& key) {
  if (auto v = node.value_exact<int64_t>()) return *v;
  LATTICE_THROW(ConfigError, "config key '{}' = {} must be an integer", key, describe(node));
}

int64_t get_positive(const toml::node& node, const std::string& key) {
  int64_t v = get_int(node, key);
  if (v <= 0) LATTICE_THROW(ConfigError, "config key '{}' = {} must be positive", key, v);
  return v;
}

int64_t get_non_negative(const toml::node& node, const std::string& key) {
  int64_t v = get_int(node, key);
  if (v < 0) LATTICE_THROW(ConfigError, "config key '{}' = {} must not be negative", key, v);
  return v;
}

double get_float(const toml::node& node, const std::string& key);

// A duration in seconds: positive (or zero, where zero means "derive it"), at most a day.
double get_seconds(const toml::node& node, const std::string& key, bool zero_allowed = false) {
  const double s = get_float(node, key);
  if (!((zero_allowed ? s >= 0.0 : s > 0.0) && s <= 86400.0)) {
    LATTICE_THROW(ConfigError,
                  "config key '{}' = {} must be a duration in seconds{} ---> HINT: e.g. 2 or 0.5",
                  key, s, zero_allowed ? " (0: the default)" : " greater than 0");
  }
  return s;
}

double get_float(const toml::node& node, const std::string& key) {
  if (auto v = node.value<double>(); v && (node.is_floating_point() || node.is_integer())) {
    if (!std::isfinite(*v)) {
      LATTICE_THROW(ConfigError, "config key '{}' = {} must be a finite number", key, *v);
    }
    return *v;
  }
  LATTICE_THROW(ConfigError, "config key '{}' = {} must be a number", key, describe(node));
}

std::string get_string(const toml::node& node, const std::string& key) {
  if (auto v = node.value_exact<std::string>()) return *v;
  LATTICE_THROW(ConfigError, "config key '{}' = {} must be a string", key, describe(node));
}

bool get_bool(const toml::node& node, const std::string& key) {
  if (auto v = node.value_exact<bool>()) return *v;
  LATTICE_THROW(ConfigError, "config key '{}' = {} must be true or false", key, describe(node));
}

// A number of ranks along one mesh axis (parallel.dp, parallel.tp): 1 means not split that way.
int get_rank_count(const toml::node& node, const std::string& key) {
  constexpr int64_t kMaxRanks = int64_t(1) << 20;
  int64_t v = get_int(node, key);
  if (v < 1 || v > kMaxRanks) {
    LATTICE_THROW(ConfigError,
                  "config key '{}' = {} must be a number of ranks from 1 to {} ---> HINT: use 1 "
                  "(not split along this axis) or more",
                  key, v, kMaxRanks);
  }
  return int(v);
}

// The readers of values that name a choice: each parses once, into the config's enum, with an
// error naming the key and the choices.
SamplingMode get_sampling_mode(const toml::node& node, const std::string& key) {
  const std::string name = get_string(node, key);
  if (name != "sequential" && name != "shuffled") {
    LATTICE_THROW(ConfigError,
                  "config key '{}' = \"{}\" ---> HINT: use \"sequential\" or \"shuffled\"", key,
                  name);
  }
  return parse_sampling_mode(name);
}

std::string get_tokenizer(const toml::node& node, const std::string& key) {
  std::string name = get_string(node, key);
  make_tokenizer(name);  // ConfigError listing the tokenizers
  return name;
}

DType get_precision(const toml::node& node, const std::string& key) {
  const std::string name = get_string(node, key);
  if (name == "fp32" || name == "f32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  LATTICE_THROW(ConfigError, "config key '{}' = \"{}\" ---> HINT: use \"fp32\" or \"bf16\"", key,
                name);
}

GemmLibrary get_gemm_library(const toml::node& node, const std::string& key) {
  const std::string name = get_string(node, key);
  try {
    return parse_gemm_library(name);
  } catch (const ValueError& e) {
    LATTICE_THROW(ConfigError, "config key '{}': {}", key, e.what());
  }
}

// A choice key read by the parser the command-line flag uses too (one parser per key), its
// refusal prefixed with the key and the value given.
template <typename Parse>
auto get_choice(const toml::node& node, const std::string& key, Parse parse) {
  const std::string name = get_string(node, key);
  try {
    return parse(name);
  } catch (const ConfigError& e) {
    LATTICE_THROW(ConfigError, "config key '{}' = \"{}\": {}", key, name, e.what());
  }
}

TransportKind get_transport(const toml::node& node, const std::string& key) {
  return get_choice(node, key, [](std::string_view name) { return parse_transport(name); });
}

ScheduleKind get_schedule(const toml::node& node, const std::string& key) {
  return get_choice(node, key, [](std::string_view name) { return parse_schedule_kind(name); });
}

Recompute get_recompute(const toml::node& node, const std::string& key) {
  return get_choice(node, key, [](std::string_view name) { return parse_recompute(name); });
}

ModelConfig get_preset(const toml::node& node, const std::string& key) {
  return model_preset(get_string(node, key));
}
ModelFamily get_family(const toml::node& node, const std::string& key) {
  return parse_family(get_string(node, key));
}
NormKind get_norm(const toml::node& node, const std::string& key) {
  return parse_norm(get_string(node, key));
}
PositionKind get_position(const toml::node& node, const std::string& key) {
  return parse_position(get_string(node, key));
}
MlpKind get_mlp(const toml::node& node, const std::string& key) {
  return parse_mlp(get_string(node, key));
}

int get_zero_stage(const toml::node& node, const std::string& key) {
  const int64_t stage = get_int(node, key);
  if (stage < 0 || stage > 3) {
    LATTICE_THROW(ConfigError,
                  "config key '{}' = {} is not a ZeRO stage ---> HINT: use 0 (replicated), 1 "
                  "(optimizer state sharded over dp), 2 (and gradients) or 3 (and parameters)",
                  key, stage);
  }
  return int(stage);
}

double get_bucket_mb(const toml::node& node, const std::string& key) {
  const double mb = get_float(node, key);
  // 2^20 MB is a bucket of 2^40 bytes, far beyond any model here; the bound keeps mb · 2^20 an
  // exact int64.
  if (!(mb > 0.0 && mb <= double(1 << 20))) {
    LATTICE_THROW(ConfigError,
                  "config key '{}' = {} must be a positive size in MB ---> HINT: use e.g. 1 (the "
                  "default) or 0.25",
                  key, mb);
  }
  return mb;
}

std::vector<int> get_layer_counts(const toml::node& node, const std::string& key) {
  const toml::array* counts = node.as_array();
  if (counts == nullptr || counts->empty()) {
    LATTICE_THROW(ConfigError,
                  "config key '{}' = {} must be a list of layer counts, one per pipeline chunk "
                  "---> HINT: e.g. [1, 3] for 2 stages over 4 layers; leave it out to balance by "
                  "the cost model",
                  key, describe(node));
  }
  std::vector<int> out;
  for (const toml::node& count : *counts) out.push_back(int(get_positive(count, key)));
  return out;
}

double get_straggler_factor(const toml::node& node, const std::string& key) {
  const double f = get_float(node, key);
  if (!(f == 0.0 || (f > 1.0 && f <= 1000.0))) {
    LATTICE_THROW(ConfigError,
                  "config key '{}' = {} must be 0 (off) or a factor above 1 ---> HINT: e.g. 3: a "
                  "rank 3x slower than the others",
                  key, f);
  }
  return f;
}

double get_progress_factor(const toml::node& node, const std::string& key) {
  const double f = get_float(node, key);
  if (!(f > 1.0 && f <= 1000.0)) {
    LATTICE_THROW(ConfigError,
                  "config key '{}' = {} must be a factor above 1 ---> HINT: e.g. 4: a rank is "
                  "stuck after 4 times the longest it has gone without progress",
                  key, f);
  }
  return f;
}

double get_any_seconds(const toml::node& node, const std::string& key) {
  return get_seconds(node, key, /*zero_allowed=*/true);
}
double get_some_seconds(const toml::node& node, const std::string& key) {
  return get_seconds(node, key);
}

// The setter of one key: `read` the node, convert it to the member reached from the config by
// `path` (a chain of member pointers: &TrainConfig::model, &ModelConfig::n_layer).
template <class Read, class... Path>
Setter set(Read read, Path... path) {
  return [read, path...](TrainConfig& c, const toml::node& n, const std::string& k) {
    auto& field = (c.*....*path);
    field = static_cast<std::remove_reference_t<decltype(field)>>(read(n, k));
  };
}

// Every key, its reader and its field. model.preset is applied before the other keys.
const std::map<std::string, Setter>& setters() {
  using T = TrainConfig;
  using M = ModelConfig;
  using P = ParallelConfig;
  using E = ElasticConfig;
  using A = AdamWHyper;
  static const std::map<std::string, Setter> table = {
      {"model.preset", set(get_preset, &T::model)},
      {"model.family", set(get_family, &T::model, &M::family)},
      {"model.vocab_size", set(get_positive, &T::model, &M::vocab_size)},
      {"model.n_layer", set(get_positive, &T::model, &M::n_layer)},
      {"model.n_head", set(get_positive, &T::model, &M::n_head)},
      {"model.n_kv_head", set(get_positive, &T::model, &M::n_kv_head)},
      {"model.d_model", set(get_positive, &T::model, &M::d_model)},
      {"model.d_ff", set(get_positive, &T::model, &M::d_ff)},
      {"model.seq_len", set(get_positive, &T::model, &M::seq_len)},
      {"model.norm", set(get_norm, &T::model, &M::norm)},
      {"model.norm_eps", set(get_float, &T::model, &M::norm_eps)},
      {"model.position", set(get_position, &T::model, &M::position)},
      {"model.rope_theta", set(get_float, &T::model, &M::rope_theta)},
      {"model.mlp", set(get_mlp, &T::model, &M::mlp)},
      {"model.bias", set(get_bool, &T::model, &M::bias)},
      {"model.tied_embeddings", set(get_bool, &T::model, &M::tied_embeddings)},
      {"model.init_std", set(get_float, &T::model, &M::init_std)},
      {"model.n_experts", set(get_non_negative, &T::model, &M::n_experts)},
      {"model.experts_per_token", set(get_positive, &T::model, &M::experts_per_token)},
      {"model.moe_aux_loss", set(get_float, &T::model, &M::moe_aux_loss)},
      {"model.moe_z_loss", set(get_float, &T::model, &M::moe_z_loss)},
      {"model.capacity_factor", set(get_float, &T::model, &M::capacity_factor)},
      {"data.dir", set(get_string, &T::data_dir)},
      {"data.mode", set(get_sampling_mode, &T::data_mode)},
      {"data.tokenizer", set(get_tokenizer, &T::tokenizer)},
      {"batch.micro_batch", set(get_non_negative, &T::micro_batch)},
      {"batch.micro_batches", set(get_non_negative, &T::micro_batches)},
      {"batch.global_batch", set(get_non_negative, &T::global_batch)},
      {"batch.seq_len", set(get_non_negative, &T::seq_len)},
      {"optim.lr", set(get_float, &T::lr)},
      {"optim.min_lr", set(get_float, &T::min_lr)},
      {"optim.warmup_steps", set(get_non_negative, &T::warmup_steps)},
      {"optim.decay_steps", set(get_non_negative, &T::decay_steps)},
      {"optim.beta1", set(get_float, &T::adam, &A::beta1)},
      {"optim.beta2", set(get_float, &T::adam, &A::beta2)},
      {"optim.eps", set(get_float, &T::adam, &A::eps)},
      {"optim.weight_decay", set(get_float, &T::adam, &A::weight_decay)},
      {"optim.grad_clip", set(get_float, &T::grad_clip)},
      {"train.steps", set(get_positive, &T::steps)},
      {"train.precision", set(get_precision, &T::compute_dtype)},
      {"train.gemm_library", set(get_gemm_library, &T::gemm_library)},
      {"train.seed", set(get_non_negative, &T::seed)},
      {"train.threads", set(get_non_negative, &T::threads)},
      {"train.log_interval", set(get_positive, &T::log_interval)},
      {"eval.interval", set(get_non_negative, &T::eval_interval)},
      {"eval.batches", set(get_non_negative, &T::eval_batches)},
      {"sample.tokens", set(get_non_negative, &T::sample_tokens)},
      {"sample.temperature", set(get_float, &T::sample_temperature)},
      {"sample.prompt", set(get_string, &T::sample_prompt)},
      {"sample.seed", set(get_non_negative, &T::sample_seed)},
      {"output.dir", set(get_string, &T::out_dir)},
      {"output.checkpoint_every", set(get_non_negative, &T::checkpoint_every)},
      {"output.keep_last", set(get_positive, &T::keep_last)},
      {"output.checkpoint_async", set(get_bool, &T::checkpoint_async)},
      // parallel (the `lattice train` flags of the same names override these)
      {"parallel.dp", set(get_rank_count, &T::parallel, &P::dp)},
      {"parallel.tp", set(get_rank_count, &T::parallel, &P::tp)},
      {"parallel.cp", set(get_rank_count, &T::parallel, &P::cp)},
      {"parallel.ep", set(get_rank_count, &T::parallel, &P::ep)},
      {"parallel.sp", set(get_bool, &T::parallel, &P::sequence_parallel)},
      {"parallel.zero", set(get_zero_stage, &T::parallel, &P::zero)},
      {"parallel.bucket_mb", set(get_bucket_mb, &T::parallel, &P::bucket_mb)},
      {"parallel.transport", set(get_transport, &T::parallel, &P::transport)},
      {"parallel.check_replicas", set(get_bool, &T::parallel, &P::check_replicas)},
      {"parallel.pp", set(get_rank_count, &T::parallel, &P::pp)},
      {"parallel.schedule", set(get_schedule, &T::parallel, &P::schedule)},
      {"parallel.virtual_stages", set(get_rank_count, &T::parallel, &P::virtual_stages)},
      {"parallel.layers_per_chunk", set(get_layer_counts, &T::parallel, &P::layers_per_chunk)},
      {"parallel.recompute", set(get_recompute, &T::parallel, &P::recompute)},
      {"parallel.deterministic", set(get_bool, &T::parallel, &P::deterministic)},
      {"parallel.comm_profile", set(get_string, &T::parallel, &P::comm_profile)},
      {"parallel.timeout_s", set(get_any_seconds, &T::parallel, &P::timeout_s)},
      {"elastic.heartbeat_interval_s",
       set(get_some_seconds, &T::elastic, &E::heartbeat_interval_s)},
      {"elastic.heartbeat_timeout_s", set(get_some_seconds, &T::elastic, &E::heartbeat_timeout_s)},
      {"elastic.progress_timeout_s", set(get_some_seconds, &T::elastic, &E::progress_timeout_s)},
      {"elastic.progress_factor", set(get_progress_factor, &T::elastic, &E::progress_factor)},
      {"elastic.snapshot_every", set(get_non_negative, &T::elastic, &E::snapshot_every)},
      {"elastic.straggler_factor", set(get_straggler_factor, &T::elastic, &E::straggler_factor)},
  };
  return table;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

[[noreturn]] void unknown_key(const std::string& key, std::string_view source) {
  LATTICE_THROW(ConfigError, "{}: unknown config key '{}' ---> HINT: did you mean '{}'?", source,
                key, nearest_key(key, train_config_keys()));
}

// Flattens a parsed TOML document into (section.key, node) pairs, in file order.
void flatten(const toml::table& table, const std::string& prefix,
             std::vector<std::pair<std::string, const toml::node*>>& out, std::string_view source) {
  for (auto&& [name, node] : table) {
    std::string key =
        prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
    if (const toml::table* sub = node.as_table()) {
      if (!prefix.empty()) unknown_key(key, source);
      flatten(*sub, key, out, source);
    } else {
      out.emplace_back(key, &node);
    }
  }
}

}  // namespace

std::vector<std::string> train_config_keys() {
  std::vector<std::string> keys;
  for (const auto& [key, setter] : setters()) keys.push_back(key);
  return keys;
}

std::string nearest_key(std::string_view key, const std::vector<std::string>& keys) {
  // The names nanoGPT, llm.c, Hugging Face, Megatron-LM and DeepSpeed use for the same settings.
  static const std::map<std::string, std::string, std::less<>> kAliases = {
      {"learning_rate", "optim.lr"},
      {"max_lr", "optim.lr"},
      {"warmup_iters", "optim.warmup_steps"},
      {"lr_decay_iters", "optim.decay_steps"},
      {"max_iters", "train.steps"},
      {"iters", "train.steps"},
      {"num_steps", "train.steps"},
      {"dtype", "train.precision"},
      {"batch_size", "batch.micro_batch"},
      {"gradient_accumulation_steps", "batch.micro_batches"},
      {"block_size", "batch.seq_len"},
      {"n_embd", "model.d_model"},
      {"hidden_size", "model.d_model"},
      {"n_inner", "model.d_ff"},
      {"intermediate_size", "model.d_ff"},
      {"num_hidden_layers", "model.n_layer"},
      {"num_attention_heads", "model.n_head"},
      {"num_key_value_heads", "model.n_kv_head"},
      {"num_local_experts", "model.n_experts"},
      {"num_experts", "model.n_experts"},
      {"num_experts_per_tok", "model.experts_per_token"},
      {"moe_router_topk", "model.experts_per_token"},
      {"router_aux_loss_coef", "model.moe_aux_loss"},
      {"moe_aux_loss_coeff", "model.moe_aux_loss"},
      {"moe_z_loss_coeff", "model.moe_z_loss"},
      {"eval_interval", "eval.interval"},
      {"eval_iters", "eval.batches"},
      {"out_dir", "output.dir"},
      {"seed", "train.seed"},
      {"data_parallel_size", "parallel.dp"},
      {"tensor_model_parallel_size", "parallel.tp"},
      {"tensor_parallel_size", "parallel.tp"},
      {"context_parallel_size", "parallel.cp"},
      {"expert_model_parallel_size", "parallel.ep"},
      {"expert_parallel_size", "parallel.ep"},
      {"sequence_parallel", "parallel.sp"},
      {"zero_stage", "parallel.zero"},
      {"pipeline_model_parallel_size", "parallel.pp"},
      {"virtual_pipeline_model_parallel_size", "parallel.virtual_stages"},
      {"recompute_granularity", "parallel.recompute"},
  };
  std::string_view last =
      key.substr(key.find('.') == std::string_view::npos ? 0 : key.find('.') + 1);
  if (auto alias = kAliases.find(last); alias != kAliases.end()) return alias->second;
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& candidate : keys) {
    size_t d = edit_distance(key, candidate);
    // Also compare the part after the section, so "train.lr" suggests "optim.lr".
    auto dot = candidate.find('.');
    auto key_dot = key.find('.');
    if (dot != std::string::npos && key_dot != std::string::npos) {
      d = std::min(d, edit_distance(key.substr(key_dot + 1), candidate.substr(dot + 1)) + 1);
    }
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

TrainConfig parse_train_config(std::string_view toml_text, std::string_view source,
                               const std::vector<std::string>& overrides) {
  toml::table document;
  try {
    document = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    LATTICE_THROW(ConfigError, "{}:{}:{}: malformed TOML: {}", source, where.line, where.column,
                  e.description());
  }
  std::vector<std::pair<std::string, const toml::node*>> entries;
  flatten(document, "", entries, source);

  // Overrides are parsed as TOML values ("lr=3e-4", "precision=\"bf16\""); a bare word that
  // is not valid TOML is taken as a string ("precision=bf16").
  std::vector<toml::table> override_docs;
  override_docs.reserve(overrides.size());
  for (const std::string& text : overrides) {
    auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      LATTICE_THROW(ConfigError, "--set '{}' is not of the form section.key=value", text);
    }
    std::string key = text.substr(0, eq), value = text.substr(eq + 1);
    toml::table doc;
    try {
      doc = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
      doc = toml::table{{"v", value}};
    }
    override_docs.push_back(std::move(doc));
    entries.emplace_back(key, override_docs.back().get("v"));
  }

  TrainConfig config;
  const auto& table = setters();
  for (const auto& [key, node] : entries) {
    if (!table.contains(key)) unknown_key(key, source);
  }
  // The preset first, so that the other model keys override it wherever they appear.
  for (const auto& [key, node] : entries) {
    if (key == "model.preset") table.at(key)(config, *node, key);
  }
  for (const auto& [key, node] : entries) {
    if (key != "model.preset") table.at(key)(config, *node, key);
  }
  config.model.validate();
  if (config.seq_len == 0) config.seq_len = config.model.seq_len;
  if (config.seq_len > config.model.seq_len) {
    LATTICE_THROW(ConfigError,
                  "batch.seq_len = {} exceeds model.seq_len = {} ---> HINT: lower batch.seq_len "
                  "or raise model.seq_len",
                  config.seq_len, config.model.seq_len);
  }
  if (config.decay_steps == 0) config.decay_steps = config.steps;
  config.adam.lr = config.lr;
  return config;
}

TrainConfig load_train_config(const std::filesystem::path& path,
                              const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) {
    LATTICE_THROW(ConfigError, "cannot read config file '{}' ---> HINT: check the path",
                  path.string());
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_train_config(text.str(), path.string(), overrides);
}

double TrainConfig::collective_timeout_s() const {
  return parallel.timeout_s > 0.0 ? parallel.timeout_s : 30.0;
}

void TrainConfig::check_timeout_ladder() const {
  if (!(elastic.heartbeat_interval_s < elastic.heartbeat_timeout_s)) {
    LATTICE_THROW(ConfigError,
                  "elastic.heartbeat_interval_s = {} must be below elastic.heartbeat_timeout_s = "
                  "{}: a live rank would look dead between two beats ---> HINT: keep the timeout "
                  "several beats long, e.g. 0.1 and 1",
                  elastic.heartbeat_interval_s, elastic.heartbeat_timeout_s);
  }
  if (!(elastic.heartbeat_timeout_s <= elastic.progress_timeout_s)) {
    LATTICE_THROW(ConfigError,
                  "elastic.heartbeat_timeout_s = {} must not exceed elastic.progress_timeout_s = "
                  "{}: a stopped rank (no heartbeat) would be taken for a stuck one ---> HINT: "
                  "e.g. 1 and 2",
                  elastic.heartbeat_timeout_s, elastic.progress_timeout_s);
  }
  if (parallel.transport == TransportKind::kGloo &&
      !(elastic.progress_timeout_s < collective_timeout_s())) {
    LATTICE_THROW(ConfigError,
                  "parallel.timeout_s = {} must be above elastic.progress_timeout_s = {}: under "
                  "lattice launch the agent finds a dead, stopped or stuck rank first, and a "
                  "collective deadline shorter than that would fail ranks that only wait for a "
                  "slower peer (one still evaluating) ---> HINT: leave parallel.timeout_s at 0 "
                  "(30 s) or lower elastic.progress_timeout_s",
                  collective_timeout_s(), elastic.progress_timeout_s);
  }
}

std::vector<int> TrainConfig::refittable_worlds() const {
  TrainConfig resolved = *this;
  resolved.resolve_batch(parallel.dp);
  const int model_ranks = parallel.tp * parallel.cp * parallel.pp;
  std::vector<int> fitting;
  for (int dp = 1; dp * model_ranks <= parallel.world_size(); ++dp) {
    if (resolved.global_batch % dp == 0) fitting.push_back(dp * model_ranks);
  }
  return fitting;
}

void TrainConfig::refit_to_world(int world) {
  const std::vector<int> fitting = refittable_worlds();
  resolve_batch(parallel.dp);
  const int model_ranks = parallel.tp * parallel.cp * parallel.pp;
  if (std::find(fitting.begin(), fitting.end(), world) == fitting.end()) {
    LATTICE_THROW(ConfigError,
                  "no layout of {} ranks keeps the run: tp × cp × pp = {} × {} × {} must divide "
                  "the world and the global batch of {} sequences must split over dp = world / "
                  "(tp × cp × pp) ---> HINT: world sizes that keep it: {}",
                  world, parallel.tp, parallel.cp, parallel.pp, global_batch,
                  fmt::join(fitting, ", "));
  }
  const int64_t dp = world / model_ranks;
  const int64_t rows = global_batch / dp;  // per rank and step
  int64_t batch = std::min(micro_batch, rows);
  while (rows % batch != 0) --batch;
  parallel.dp = int(dp);
  // Expert parallelism: the largest ep up to the run's that divides the new dp and the experts
  // (1 always does); the snapshot places each expert anew (it is written once, by name).
  if (parallel.ep > 1) {
    int ep = parallel.ep;
    while (dp % ep != 0 || model.n_experts % ep != 0) --ep;
    parallel.ep = ep;
  }
  micro_batch = batch;
  micro_batches = rows / batch;
}

void TrainConfig::resolve_batch(int64_t dp) {
  LATTICE_CHECK_GE(dp, 1);
  const std::string formula =
      fmt::format("global_batch = micro_batch × micro_batches × dp ({} = {} × {} × {})",
                  global_batch, micro_batch, micro_batches, dp);
  // Products of sizes read from the file: refused when they overflow int64, never wrapped
  // (micro_batch = 2^62 with micro_batches = 4: tests/fuzz/regressions/toml_config/).
  auto product = [&](int64_t a, int64_t b) {
    int64_t p = 0;
    if (__builtin_mul_overflow(a, b, &p)) {
      LATTICE_THROW(ConfigError,
                    "the batch sizes overflow: {} × {} exceeds {}; {} ---> HINT: the batch keys "
                    "count sequences, e.g. batch.micro_batch = 8",
                    a, b, INT64_MAX, formula);
    }
    return p;
  };
  int given = (micro_batch > 0) + (micro_batches > 0) + (global_batch > 0);
  if (given < 2) {
    if (micro_batch > 0 && micro_batches == 0 && global_batch == 0) {
      micro_batches = 1;  // the common case: one micro-batch per step
    } else {
      LATTICE_THROW(ConfigError,
                    "the batch is under-specified: give two of batch.micro_batch, "
                    "batch.micro_batches, batch.global_batch; {}",
                    formula);
    }
  }
  if (global_batch == 0) {
    global_batch = product(product(micro_batch, micro_batches), dp);
  } else if (micro_batches == 0) {
    if (global_batch % product(micro_batch, dp) != 0) {
      LATTICE_THROW(ConfigError,
                    "batch.global_batch = {} is not divisible by micro_batch × dp = {} × {}; {}",
                    global_batch, micro_batch, dp, formula);
    }
    micro_batches = global_batch / product(micro_batch, dp);
  } else if (micro_batch == 0) {
    if (global_batch % product(micro_batches, dp) != 0) {
      LATTICE_THROW(ConfigError,
                    "batch.global_batch = {} is not divisible by micro_batches × dp = {} × {}; {}",
                    global_batch, micro_batches, dp, formula);
    }
    micro_batch = global_batch / product(micro_batches, dp);
  } else if (const int64_t per_step = product(product(micro_batch, micro_batches), dp);
             global_batch != per_step) {
    LATTICE_THROW(ConfigError,
                  "inconsistent batch: {} but micro_batch × micro_batches × dp = {} ---> HINT: "
                  "state two of the three and let Lattice derive the third (the learning rate is "
                  "never rescaled)",
                  formula, per_step);
  }
}

}  // namespace lattice
