#include "train/train_config.h"

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "core/error.h"
#include "model/transformer.h"
#include "parallel/pipeline_schedule.h"

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

const std::map<std::string, Setter>& setters() {
  static const std::
      map<std::string, Setter>
          table =
              {
                  // model (model.preset is applied first, the other keys override it)
                  {"model.preset",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model = model_preset(get_string(n, k));
                   }},
                  {"model.family",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.family = parse_family(get_string(n, k));
                   }},
                  {"model.vocab_size",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.vocab_size = get_positive(n, k);
                   }},
                  {"model.n_layer",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.n_layer = get_positive(n, k);
                   }},
                  {"model.n_head",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.n_head = get_positive(n, k);
                   }},
                  {"model.n_kv_head",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.n_kv_head = get_positive(n, k);
                   }},
                  {"model.d_model",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.d_model = get_positive(n, k);
                   }},
                  {"model.d_ff", [](TrainConfig& c, const toml::node& n,
                                    const std::string& k) { c.model.d_ff = get_positive(n, k); }},
                  {"model.seq_len",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.seq_len = get_positive(n, k);
                   }},
                  {"model.norm",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.norm = parse_norm(get_string(n, k));
                   }},
                  {"model.norm_eps",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.norm_eps = float(get_float(n, k));
                   }},
                  {"model.position",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.position = parse_position(get_string(n, k));
                   }},
                  {"model.rope_theta",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.rope_theta = float(get_float(n, k));
                   }},
                  {"model.mlp",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.mlp = parse_mlp(get_string(n, k));
                   }},
                  {"model.bias", [](TrainConfig& c, const toml::node& n,
                                    const std::string& k) { c.model.bias = get_bool(n, k); }},
                  {"model.tied_embeddings",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.tied_embeddings = get_bool(n, k);
                   }},
                  {"model.init_std",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.model.init_std = float(get_float(n, k));
                   }},
                  // data
                  {"data.dir", [](TrainConfig& c, const toml::node& n,
                                  const std::string& k) { c.data_dir = get_string(n, k); }},
                  {"data.mode",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.data_mode = get_string(n, k);
                     if (c.data_mode != "sequential" && c.data_mode != "shuffled") {
                       LATTICE_THROW(
                           ConfigError,
                           "config key '{}' = \"{}\" ---> HINT: use \"sequential\" or \"shuffled\"",
                           k, c.data_mode);
                     }
                   }},
                  {"data.tokenizer", [](TrainConfig& c, const toml::node& n,
                                        const std::string& k) { c.tokenizer = get_string(n, k); }},
                  // batch
                  {"batch.micro_batch",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.micro_batch = get_non_negative(n, k);
                   }},
                  {"batch.micro_batches",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.micro_batches = get_non_negative(n, k);
                   }},
                  {"batch.global_batch",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.global_batch = get_non_negative(n, k);
                   }},
                  {"batch.seq_len",
                   [](TrainConfig& c, const toml::node& n,
                      const std::string& k) { c.seq_len = get_non_negative(n, k); }},
                  // optim
                  {
                      "optim.lr", [](TrainConfig& c, const toml::node& n,
                                     const std::string& k) { c.lr = float(get_float(n, k)); }},
                  {"optim.min_lr", [](TrainConfig& c, const toml::node& n,
                                      const std::string& k) { c.min_lr = float(get_float(n, k)); }},
                  {"optim.warmup_steps",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.warmup_steps = get_non_negative(n, k);
                   }},
                  {"optim.decay_steps",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.decay_steps = get_non_negative(n, k);
                   }},
                  {"optim.beta1",
                   [](
                       TrainConfig& c, const toml::node& n,
                       const std::
                           string& k) { c.adam.beta1 = float(get_float(n, k)); }},
                  {"optim.beta2",
                   [](
                       TrainConfig& c, const toml::node& n,
                       const std::
                           string& k) { c.adam.beta2 = float(get_float(n, k)); }},
                  {"optim.eps", [](TrainConfig& c, const toml::node& n,
                                   const std::string& k) { c.adam.eps = float(get_float(n, k)); }},
                  {"optim.weight_decay",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.adam.weight_decay = float(get_float(n, k));
                   }},
                  {"optim.grad_clip",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.grad_clip = float(get_float(n, k));
                   }},
                  // train
                  {
                      "train.steps", [](TrainConfig& c, const toml::node& n,
                                        const std::string& k) { c.steps = get_positive(n, k); }},
                  {"train.precision",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     std::string p = get_string(n, k);
                     if (p == "fp32" || p == "f32") {
                       c.compute_dtype = DType::kF32;
                     } else if (p == "bf16") {
                       c.compute_dtype = DType::kBF16;
                     } else {
                       LATTICE_THROW(ConfigError,
                                     "config key '{}' = \"{}\" ---> HINT: use \"fp32\" or \"bf16\"",
                                     k, p);
                     }
                   }},
                  {"train.seed",
                   [](TrainConfig& c, const toml::node& n,
                      const std::string& k) { c.seed = uint64_t(get_non_negative(n, k)); }},
                  {"train.threads",
                   [](TrainConfig& c, const toml::node& n,
                      const std::string& k) { c.threads = int(get_non_negative(n, k)); }},
                  {"train.log_interval",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.log_interval = get_positive(n, k);
                   }},
                  // eval
                  {"eval.interval",
                   [](TrainConfig& c, const toml::node& n,
                      const std::string& k) { c.eval_interval = get_non_negative(n, k); }},
                  {"eval.batches",
                   [](TrainConfig& c, const toml::node& n,
                      const std::string& k) { c.eval_batches = get_non_negative(n, k); }},
                  // sample
                  {"sample.tokens",
                   [](TrainConfig& c, const toml::node& n,
                      const std::string& k) { c.sample_tokens = get_non_negative(n, k); }},
                  {"sample.temperature",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.sample_temperature = float(get_float(n, k));
                   }},
                  {"sample.prompt",
                   [](TrainConfig& c, const toml::node& n,
                      const std::string& k) { c.sample_prompt = get_string(n, k); }},
                  {"sample.seed",
                   [](TrainConfig& c, const toml::node& n,
                      const std::string& k) { c.sample_seed = uint64_t(get_non_negative(n, k)); }},
                  // output
                  {"output.dir", [](TrainConfig& c, const toml::node& n,
                                    const std::string& k) { c.out_dir = get_string(n, k); }},
                  {"output.checkpoint_every",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.checkpoint_every = get_non_negative(n, k);
                   }},
                  {"output.keep_last",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.keep_last = get_positive(n, k);
                   }},
                  {"output.checkpoint_async",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.checkpoint_async = get_bool(n, k);
                   }},
                  // parallel (the `lattice train` flags of the same names override these)
                  {"parallel.dp",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.parallel.dp = get_rank_count(n, k);
                   }},
                  {"parallel.tp",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.parallel.tp = get_rank_count(n, k);
                   }},
                  {"parallel.sp",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.parallel.sequence_parallel = get_bool(n, k);
                   }},
                  {"parallel.zero",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     int64_t stage = get_int(n, k);
                     if (stage < 0 || stage > 3) {
                       LATTICE_THROW(ConfigError,
                                     "config key '{}' = {} is not a ZeRO stage ---> HINT: use 0 "
                                     "(replicated), 1 (optimizer state sharded over dp), 2 (and "
                                     "gradients) or 3 (and parameters)",
                                     k, stage);
                     }
                     c.parallel.zero = int(stage);
                   }},
                  {"parallel.bucket_mb",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     double mb = get_float(n, k);
                     // 2^20 MB is a bucket of 2^40 bytes, far beyond any model here; the bound
                     // keeps mb · 2^20 an exact int64.
                     if (!(mb > 0.0 && mb <= double(1 << 20))) {
                       LATTICE_THROW(ConfigError,
                                     "config key '{}' = {} must be a positive size in MB ---> "
                                     "HINT: use e.g. 1 (the default) or 0.25",
                                     k, mb);
                     }
                     c.parallel.bucket_mb = mb;
                   }},
                  {"parallel.transport",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     std::string t = get_string(n, k);
                     if (t != "threads" && t != "mpi" && t != "gloo") {
                       LATTICE_THROW(ConfigError,
                                     "config key '{}' = \"{}\" ---> HINT: use \"threads\" "
                                     "(in-process ranks), \"mpi\" (one rank per process, "
                                     "under mpirun) or \"gloo\" (one rank per process, under "
                                     "lattice launch)",
                                     k, t);
                     }
                     c.parallel.transport = t;
                   }},
                  {"parallel.check_replicas",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.parallel.check_replicas = get_bool(n, k);
                   }},
                  {"parallel.pp",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.parallel.pp = get_rank_count(n, k);
                   }},
                  {"parallel.schedule",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     std::string name = get_string(n, k);
                     parse_schedule_kind(name);  // ConfigError listing the schedules
                     c.parallel.schedule = name;
                   }},
                  {"parallel.virtual_stages",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.parallel.virtual_stages = get_rank_count(n, k);
                   }},
                  {"parallel.layers_per_chunk",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     const toml::array* counts = n.as_array();
                     if (counts == nullptr || counts->empty()) {
                       LATTICE_THROW(ConfigError,
                                     "config key '{}' = {} must be a list of layer counts, one "
                                     "per pipeline chunk ---> HINT: e.g. [1, 3] for 2 stages "
                                     "over 4 layers; leave it out to balance by the cost model",
                                     k, describe(n));
                     }
                     c.parallel.layers_per_chunk.clear();
                     for (const toml::node& count : *counts) {
                       c.parallel.layers_per_chunk.push_back(int(get_positive(count, k)));
                     }
                   }},
                  {"parallel.recompute",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     std::string name = get_string(n, k);
                     parse_recompute(name);  // ConfigError listing the choices
                     c.parallel.recompute = name;
                   }},
                  {"parallel.deterministic",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.parallel.deterministic = get_bool(n, k);
                   }},
                  {"parallel.comm_profile",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.parallel.comm_profile = get_string(n, k);
                   }},
                  {"parallel.timeout_s",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.parallel.timeout_s = get_seconds(n, k, /*zero_allowed=*/true);
                   }},
                  {"elastic.heartbeat_interval_s",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.elastic.heartbeat_interval_s = get_seconds(n, k);
                   }},
                  {"elastic.heartbeat_timeout_s",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.elastic.heartbeat_timeout_s = get_seconds(n, k);
                   }},
                  {"elastic.progress_timeout_s",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.elastic.progress_timeout_s = get_seconds(n, k);
                   }},
                  {"elastic.snapshot_every",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     c.elastic.snapshot_every = get_non_negative(n, k);
                   }},
                  {"elastic.straggler_factor",
                   [](TrainConfig& c, const toml::node& n, const std::string& k) {
                     const double f = get_float(n, k);
                     if (!(f == 0.0 || (f > 1.0 && f <= 1000.0))) {
                       LATTICE_THROW(ConfigError,
                                     "config key '{}' = {} must be 0 (off) or a factor above 1 "
                                     "---> HINT: e.g. 3: a rank 3x slower than the others",
                                     k, f);
                     }
                     c.elastic.straggler_factor = f;
                   }},
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
      {"eval_interval", "eval.interval"},
      {"eval_iters", "eval.batches"},
      {"out_dir", "output.dir"},
      {"seed", "train.seed"},
      {"data_parallel_size", "parallel.dp"},
      {"tensor_model_parallel_size", "parallel.tp"},
      {"tensor_parallel_size", "parallel.tp"},
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
  if (parallel.transport == "gloo" && !(elastic.progress_timeout_s < collective_timeout_s())) {
    LATTICE_THROW(ConfigError,
                  "parallel.timeout_s = {} must be above elastic.progress_timeout_s = {}: under "
                  "lattice launch the agent finds a dead, stopped or stuck rank first, and a "
                  "collective deadline shorter than that would fail ranks that only wait for a "
                  "slower peer (one still evaluating) ---> HINT: leave parallel.timeout_s at 0 "
                  "(30 s) or lower elastic.progress_timeout_s",
                  collective_timeout_s(), elastic.progress_timeout_s);
  }
}

void TrainConfig::refit_to_world(int world) {
  resolve_batch(parallel.dp);
  const int model_ranks = parallel.tp * parallel.pp;
  // The world sizes up to the current one that keep the global batch whole.
  std::vector<int> fitting;
  for (int dp = 1; dp * model_ranks <= parallel.world_size(); ++dp) {
    if (global_batch % dp == 0) fitting.push_back(dp * model_ranks);
  }
  if (world % model_ranks != 0 || global_batch % (world / model_ranks) != 0) {
    LATTICE_THROW(ConfigError,
                  "no layout of {} ranks keeps the run: tp × pp = {} × {} must divide the world "
                  "and the global batch of {} sequences must split over dp = world / (tp × pp) "
                  "---> HINT: world sizes that keep it: {}",
                  world, parallel.tp, parallel.pp, global_batch, fmt::join(fitting, ", "));
  }
  const int64_t dp = world / model_ranks;
  const int64_t rows = global_batch / dp;  // per rank and step
  int64_t batch = std::min(micro_batch, rows);
  while (rows % batch != 0) --batch;
  parallel.dp = int(dp);
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
