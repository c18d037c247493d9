// Hugging Face weights: import (--init-from) and export (lattice export).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/flat_range.h"
#include "ckpt/hf_format.h"
#include "ckpt/model_config_json.h"
#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "core/json_field.h"

namespace lattice {

namespace fs = std::filesystem;

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The registry name a file's tensor stands for, or "" for a known non-parameter to skip.
std::string canonical_name(const std::string& name, const ModelConfig& config) {
  if (config.family == ModelFamily::kGpt2) {
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) return "";
    if (name == "lm_head.weight" && config.tied_embeddings) return "";  // a copy of wte
    if (!name.starts_with("transformer.") && name != "lm_head.weight") return "transformer." + name;
  }
  return name;
}

// Features of Hugging Face's Llama and Mixtral that Lattice's blocks lack: a ConfigError naming
// the key and the fix, for a config.json (`origin`) whose model would compute another function.
// `seq_len` is the longest context the model attends over.
constexpr const char* kHfConfigHint =
    "pass a Hugging Face config.json as the hub writes it (download the model's config.json "
    "again)";

void refuse_missing_features(const nlohmann::json& document, const std::string& origin,
                             int64_t seq_len) {
  const JsonField j(document, origin, kHfConfigHint);
  const std::string type = j.string_or("model_type", "");
  if (type != "llama" && type != "mixtral") return;
  auto refuse = [&](std::string_view key, const nlohmann::json& value, std::string_view lack,
                    std::string_view fix) {
    LATTICE_THROW(ConfigError, "{}: \"{}\": {}: {} ---> HINT: {}", origin, key, value.dump(), lack,
                  fix);
  };
  if (const std::optional<JsonField> w = j.find("sliding_window"); w && !w->is_null()) {
    const int64_t window = w->integer();
    if (window < seq_len) {
      refuse(
          "sliding_window", w->raw(),
          fmt::format("Lattice attends over the whole context ({} tokens), not a window", seq_len),
          fmt::format("set model.seq_len (and batch.seq_len) to at most {} so the window "
                      "covers every context, or write \"sliding_window\": null if the model "
                      "was trained without one",
                      window));
    }
  }
  if (type == "mixtral") {
    for (const char* key : {"attention_bias", "mlp_bias"}) {
      if (j.boolean_or(key, false)) {
        refuse(key, j[key].raw(), "Mixtral's attention and experts have no biases in Lattice",
               fmt::format("write \"{}\": false (only for weights without bias tensors)", key));
      }
    }
    if (j.number_or("router_jitter_noise", 0.0) != 0.0) {
      refuse("router_jitter_noise", j["router_jitter_noise"].raw(),
             "Lattice's router adds no noise to its inputs", "write \"router_jitter_noise\": 0.0");
    }
  } else if (j.boolean_or("attention_bias", false) != j.boolean_or("mlp_bias", false)) {
    refuse("mlp_bias", nlohmann::json(j.boolean_or("mlp_bias", false)),
           "Lattice has one bias switch for attention and MLP",
           "use weights with both or neither (model.bias)");
  }
  if (const std::optional<JsonField> act = j.find("hidden_act"); act && act->string() != "silu") {
    refuse("hidden_act", act->raw(), "Lattice's SwiGLU gates with silu",
           "use a model whose hidden_act is \"silu\"");
  }
  if (const std::optional<JsonField> scaling = j.find("rope_scaling");
      scaling && !scaling->is_null()) {
    refuse("rope_scaling", scaling->raw(), "Lattice's rotary positions have no scaling",
           "write \"rope_scaling\": null (only for a model trained without it)");
  }
  if (const std::optional<JsonField> head_dim = j.find("head_dim");
      head_dim && !head_dim->is_null()) {
    const int64_t heads = j.integer_or("num_attention_heads", 0);
    const int64_t width = j.integer_or("hidden_size", 0);
    if (heads <= 0 || head_dim->integer() != width / heads) {
      refuse("head_dim", head_dim->raw(),
             "Lattice's heads are hidden_size / num_attention_heads wide",
             "use a model whose head_dim is hidden_size / num_attention_heads");
    }
  }
}

}  // namespace

nlohmann::json hf_config_json(const ModelConfig& c) {
  auto refuse = [&](std::string_view what) {
    LATTICE_THROW(ValueError,
                  "cannot export '{}' as a Hugging Face {} model: {} ---> HINT: the {} family in "
                  "Hugging Face needs {}",
                  c.name, c.moe() ? "mixtral" : family_name(c.family), what,
                  c.moe() ? "mixtral" : family_name(c.family),
                  c.family == ModelFamily::kGpt2
                      ? "layernorm, learned positions, gelu, biases and n_kv_head == n_head"
                      : (c.moe() ? "rmsnorm, rope, swiglu experts and no biases (model.bias = "
                                   "false)"
                                 : "rmsnorm, rope and swiglu"));
  };
  if (c.family == ModelFamily::kGpt2) {
    if (c.norm != NormKind::kLayerNorm) refuse("its norm is not layernorm");
    if (c.position != PositionKind::kLearned) refuse("its positions are not learned");
    if (c.mlp != MlpKind::kGelu) refuse("its MLP is not gelu");
    if (c.n_kv_head != c.n_head) refuse("it uses grouped-query attention");
    // GPT2Config defaults both to 50256 (<|endoftext|>), an id a smaller vocabulary does not
    // have (transformers warns, generate() would stop on it): said explicitly, none.
    const nlohmann::json end_of_text =
        c.vocab_size > 50256 ? nlohmann::json(50256) : nlohmann::json(nullptr);
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"bos_token_id", end_of_text},
            {"eos_token_id", end_of_text},
            {"model_type", "gpt2"},
            {"vocab_size", c.vocab_size},
            {"n_positions", c.seq_len},
            {"n_ctx", c.seq_len},
            {"n_embd", c.d_model},
            {"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_inner", c.d_ff},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", c.norm_eps},
            {"initializer_range", c.init_std},
            {"tie_word_embeddings", c.tied_embeddings},
            {"torch_dtype", "float32"}};
  }
  if (c.norm != NormKind::kRmsNorm) refuse("its norm is not rmsnorm");
  if (c.position != PositionKind::kRope) refuse("its positions are not rope");
  if (c.mlp != MlpKind::kSwiglu) refuse("its MLP is not swiglu");
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"vocab_size", c.vocab_size},
                           {"hidden_size", c.d_model},
                           {"intermediate_size", c.d_ff},
                           {"num_hidden_layers", c.n_layer},
                           {"num_attention_heads", c.n_head},
                           {"num_key_value_heads", c.n_kv_head},
                           {"max_position_embeddings", c.seq_len},
                           {"rms_norm_eps", c.norm_eps},
                           {"rope_theta", c.rope_theta},
                           {"hidden_act", "silu"},
                           {"attention_bias", c.bias},
                           {"mlp_bias", c.bias},
                           {"initializer_range", c.init_std},
                           {"tie_word_embeddings", c.tied_embeddings},
                           {"torch_dtype", "float32"}};
  if (!c.moe()) return config;
  if (c.bias) refuse("it has biases");
  // Mixtral: Llama's keys without the bias switches, plus the experts'. The router's z-loss and
  // capacity have none in transformers (which trains dropless without a z-loss), so they travel
  // under lattice_ keys for an exact round trip.
  config.erase("attention_bias");
  config.erase("mlp_bias");
  config["architectures"] = {"MixtralForCausalLM"};
  config["model_type"] = "mixtral";
  config.update({{"sliding_window", nullptr},
                 {"attention_dropout", 0.0},
                 {"num_local_experts", c.n_experts},
                 {"num_experts_per_tok", c.experts_per_token},
                 {"router_aux_loss_coef", c.moe_aux_loss},
                 {"router_jitter_noise", 0.0},
                 {"output_router_logits", false},
                 {"lattice_router_z_loss_coef", c.moe_z_loss},
                 {"lattice_capacity_factor", c.capacity_factor}});
  return config;
}

namespace {

ModelConfig config_from_hf_fields(const nlohmann::json& document, const std::string& origin) {
  const JsonField j(document, origin, kHfConfigHint);
  const std::string type = j.string_or("model_type", "");
  auto required = [&](const char* key) -> int64_t { return j[key].integer(); };
  // transformers' class defaults stand for an absent (or null) key, as from_pretrained reads it.
  auto number = [&](const char* key, double fallback) { return j.number_or(key, fallback); };
  auto integer = [&](const char* key, int64_t fallback) { return j.integer_or(key, fallback); };
  ModelConfig c;
  c.name = j.string_or("_name_or_path", "");
  if (c.name.empty()) c.name = type;
  c.vocab_size = required("vocab_size");
  c.init_std = float(number("initializer_range", 0.02));
  if (type == "gpt2") {
    c.family = ModelFamily::kGpt2;
    c.d_model = required("n_embd");
    c.n_layer = required("n_layer");
    c.n_head = required("n_head");
    c.n_kv_head = c.n_head;
    c.d_ff = integer("n_inner", 4 * c.d_model);
    c.seq_len = integer("n_positions", 1024);
    c.norm_eps = float(number("layer_norm_epsilon", 1e-5));
    c.tied_embeddings = j.boolean_or("tie_word_embeddings", true);
    const std::string act = j.string_or("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
      LATTICE_THROW(ConfigError,
                    "{}: \"activation_function\": \"{}\": Lattice's GPT-2 uses the tanh GELU "
                    "---> HINT: use a model whose activation_function is \"gelu_new\"",
                    origin, act);
    }
    c.validate();
    return c;
  }
  const bool mixtral = type == "mixtral";
  c.family = ModelFamily::kLlama;
  c.norm = NormKind::kRmsNorm;
  c.position = PositionKind::kRope;
  c.mlp = MlpKind::kSwiglu;
  c.d_model = required("hidden_size");
  c.d_ff = required("intermediate_size");
  c.n_layer = required("num_hidden_layers");
  c.n_head = required("num_attention_heads");
  // MixtralConfig defaults an absent key to 8 and, as LlamaConfig, null to num_attention_heads.
  const bool kv_absent = !j.has("num_key_value_heads");
  c.n_kv_head = kv_absent && mixtral ? 8 : integer("num_key_value_heads", c.n_head);
  c.seq_len = integer("max_position_embeddings", mixtral ? 4096 * 32 : 2048);
  c.norm_eps = float(number("rms_norm_eps", mixtral ? 1e-5 : 1e-6));
  c.rope_theta = float(number("rope_theta", mixtral ? 1e6 : 1e4));
  c.tied_embeddings = j.boolean_or("tie_word_embeddings", false);
  c.bias = !mixtral && j.boolean_or("attention_bias", false);
  if (mixtral) {
    c.n_experts = integer("num_local_experts", 8);
    c.experts_per_token = integer("num_experts_per_tok", 2);
    c.moe_aux_loss = float(number("router_aux_loss_coef", 0.001));
    c.moe_z_loss = float(number("lattice_router_z_loss_coef", 0.0));
    c.capacity_factor = float(number("lattice_capacity_factor", 0.0));
    if (c.n_experts <= 0) {
      LATTICE_THROW(ConfigError,
                    "{}: \"num_local_experts\": {}: a Mixtral model has experts ---> HINT: "
                    "write the number of experts per layer (Mixtral 8x7B: 8)",
                    origin, c.n_experts);
    }
  }
  refuse_missing_features(document, origin, c.seq_len);
  c.validate();
  return c;
}

}  // namespace

ModelConfig model_config_from_hf(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) {
    LATTICE_THROW(ConfigError, "{}: not a JSON object ---> HINT: pass a Hugging Face config.json",
                  origin);
  }
  const std::string type = j.contains("model_type") && j["model_type"].is_string()
                               ? j["model_type"].get<std::string>()
                               : "";
  if (type != "gpt2" && type != "llama" && type != "mixtral") {
    LATTICE_THROW(ConfigError,
                  "{}: \"model_type\": {} is not one Lattice reads ---> HINT: Lattice imports "
                  "\"gpt2\" (GPT2LMHeadModel), \"llama\" (LlamaForCausalLM) and \"mixtral\" "
                  "(MixtralForCausalLM)",
                  origin, j.contains("model_type") ? j["model_type"].dump() : "(missing)");
  }
  return config_from_hf_fields(j, origin);
}

ModelConfig read_hf_model_config(const fs::path& dir) {
  const fs::path path = fs::is_directory(dir) ? dir / "config.json" : dir;
  std::ifstream in(path);
  if (!in) {
    LATTICE_THROW(IoError,
                  "cannot read {} ---> HINT: pass a Hugging Face model directory (with its "
                  "config.json) or the config.json itself",
                  path.string());
  }
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    LATTICE_THROW(IoError,
                  "{} is not JSON ---> HINT: the directory's config.json is damaged; download it "
                  "again",
                  path.string());
  }
  return model_config_from_hf(j, path.string());
}

namespace {

// What the files of one import have given so far.
struct HfLoad {
  std::set<std::string> loaded;
  std::vector<std::string> unexpected, skipped;
  int64_t other_stages = 0;
};

void load_hf_file(const fs::path& file, Transformer& model, HfLoad& load) {
  SafetensorsReader reader(file);
  const ModelConfig& config = model.config();
  ParameterStore& store = model.parameters();
  const ParameterRegistry& registry = model.registry();

  // A pipeline stage holds only some layers: the file's other parameters belong to other stages.
  const ParameterRegistry whole_model(config, registry.tensor_parallel());
  std::set<std::string>& loaded = load.loaded;
  std::vector<std::string>& unexpected = load.unexpected;
  std::vector<std::string>& skipped = load.skipped;
  int64_t& other_stages = load.other_stages;
  for (const SafetensorsTensorInfo& t : reader.tensors()) {
    std::string name = canonical_name(t.name, config);
    if (name.empty()) {
      skipped.push_back(t.name);
      continue;
    }
    int index = registry.find(name);
    if (index < 0 && config.family == ModelFamily::kGpt2 && !config.bias &&
        ends_with(name, ".bias")) {
      // A bias-free model exported to Hugging Face's GPT-2 carries zero biases: accept exactly
      // those, refuse real ones.
      Arena scratch("import");
      Tensor values = Tensor::empty(scratch, t.shape, DType::kF32);
      reader.read(t.name, values, DTypePolicy::kConvert);
      for (int64_t i = 0; i < values.numel(); ++i) {
        if (values.data<float>()[i] != 0.0f) {
          LATTICE_THROW(IoError,
                        "{}: tensor '{}' holds non-zero biases but model '{}' has none ---> HINT: "
                        "set model.bias = true",
                        file.string(), t.name, config.name);
        }
      }
      skipped.push_back(t.name);
      continue;
    }
    if (index < 0 && whole_model.find(name) >= 0) {
      ++other_stages;
      continue;
    }
    if (index < 0) {
      unexpected.push_back(
          fmt::format("{} {}{}", t.name, safetensors_dtype_name(t.dtype), t.shape.to_string()));
      continue;
    }
    const ParameterSpec& spec = registry.at(index);
    if (t.shape != spec.shape) {
      LATTICE_THROW(IoError,
                    "{}: tensor '{}' has shape {}, the model ({}) expects {} ---> HINT: the "
                    "weights are for another config (d_model, n_head, vocab, ...)",
                    file.string(), t.name, t.shape.to_string(), config.name,
                    spec.shape.to_string());
    }
    if (t.dtype == DType::kI32) {
      LATTICE_THROW(IoError, "{}: tensor '{}' has dtype I32, expected F32, BF16 or F16",
                    file.string(), t.name);
    }
    // BF16 and F16 widen to the fp32 master weights exactly: no information is lost. A
    // tensor-parallel rank reads the whole tensor and keeps its shard.
    // Under ZeRO with a sharded master the values go through a local copy (ParameterStore::
    // assign keeps what this rank holds of them).
    Arena scratch("import");
    const bool direct = !store.master_sharded();
    if (registry.tensor_parallel().size == 1 || spec.shard.replicated()) {
      Tensor local =
          direct ? store.master(index)
                 : Tensor::empty(scratch, spec.local_shape, DType::kF32, MemoryCategory::kOther);
      reader.read(t.name, local, DTypePolicy::kConvert);
      if (!direct) store.assign(index, local);
    } else {
      Tensor whole = Tensor::empty(scratch, spec.shape, DType::kF32, MemoryCategory::kOther);
      reader.read(t.name, whole, DTypePolicy::kConvert);
      Tensor local =
          direct ? store.master(index)
                 : Tensor::empty(scratch, spec.local_shape, DType::kF32, MemoryCategory::kOther);
      local.zero_();  // vocabulary padding stays zero
      const BoxPlacement from = contiguous_placement(
          ShardBox::whole(spec.shape), static_cast<std::byte*>(whole.raw_data()), DType::kF32);
      for (const BoxPlacement& to :
           local_placements(spec.shape, spec.shard, local, 0, local.numel())) {
        copy_overlap(from, to);
      }
      if (!direct) store.assign(index, local);
    }
    loaded.insert(name);
  }
}

// Every parameter of `model` loaded, nothing unexpected: else an IoError naming both lists.
void finish_hf_load(const fs::path& origin, Transformer& model, const HfLoad& load) {
  const ModelConfig& config = model.config();
  const ParameterRegistry& registry = model.registry();
  const std::set<std::string>& loaded = load.loaded;
  const std::vector<std::string>& unexpected = load.unexpected;
  const std::vector<std::string>& skipped = load.skipped;
  const int64_t other_stages = load.other_stages;
  const fs::path& file = origin;
  std::vector<std::string> missing;
  for (const ParameterSpec& spec : registry.specs()) {
    if (!loaded.contains(spec.name)) {
      missing.push_back(fmt::format("{} {}", spec.name, spec.shape.to_string()));
    }
  }
  if (!missing.empty() || !unexpected.empty()) {
    LATTICE_THROW(IoError,
                  "{} does not match model '{}': missing [{}]; unexpected [{}] ---> HINT: the "
                  "file must hold exactly the model's parameters under Hugging Face names",
                  file.string(), config.name, fmt::join(missing, ", "),
                  fmt::join(unexpected, ", "));
  }
  if (other_stages > 0) {
    spdlog::info("{}: {} tensors belong to other pipeline stages", file.string(), other_stages);
  }
  if (!skipped.empty()) {
    spdlog::info("{}: skipped {} non-parameter tensors (attention masks, tied head)", file.string(),
                 skipped.size());
  }
  model.parameters().refresh_compute_copy();
}

// A Hugging Face directory's config.json against the model's: every architecture key Lattice
// writes on export must agree where the file has it.
void check_hf_config(const fs::path& dir, const ModelConfig& config) {
  const fs::path path = dir / "config.json";
  if (!fs::exists(path)) return;  // weights alone: their shapes are checked tensor by tensor
  std::ifstream in(path);
  const nlohmann::json theirs = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (theirs.is_discarded() || !theirs.is_object()) {
    LATTICE_THROW(IoError,
                  "{} is not a JSON object ---> HINT: the directory's config.json is "
                  "damaged; download it again",
                  path.string());
  }
  refuse_missing_features(theirs, path.string(), config.seq_len);
  const nlohmann::json ours = hf_config_json(config);
  std::vector<std::string> differ;
  for (const char* key :
       {"model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "num_local_experts", "num_experts_per_tok", "tie_word_embeddings"}) {
    if (!ours.contains(key) || !theirs.contains(key) || theirs[key].is_null()) continue;
    if (theirs[key] != ours[key]) {
      differ.push_back(
          fmt::format("{} is {} there, {} here", key, theirs[key].dump(), ours[key].dump()));
    }
  }
  if (!differ.empty()) {
    LATTICE_THROW(ConfigError,
                  "{} describes another architecture than model '{}': {} ---> HINT: set the "
                  "[model] keys to the checkpoint's (or choose the preset it was trained as)",
                  path.string(), config.name, fmt::join(differ, "; "));
  }
}

}  // namespace

namespace {

// The weight files of `source`: a .safetensors file itself, or a model directory's
// model.safetensors or the files its model.safetensors.index.json names (config.json checked
// against `config` first).
std::vector<fs::path> hf_weight_files(const fs::path& source, const ModelConfig& config) {
  if (!fs::is_directory(source)) return {source};
  check_hf_config(source, config);
  const fs::path single = source / "model.safetensors";
  const fs::path index = source / "model.safetensors.index.json";
  if (fs::exists(single)) return {single};
  if (!fs::exists(index)) {
    LATTICE_THROW(IoError,
                  "{} holds neither model.safetensors nor model.safetensors.index.json ---> "
                  "HINT: pass a Hugging Face model directory or a .safetensors file",
                  source.string());
  }
  // The hub's sharded layout: weight_map names the file of every tensor.
  std::ifstream in(index);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    LATTICE_THROW(IoError, "{} has no \"weight_map\" object ---> HINT: the index is damaged",
                  index.string());
  }
  std::set<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      LATTICE_THROW(IoError, "{}: the file of '{}' is not a string", index.string(), name);
    }
    files.insert(file.get<std::string>());
  }
  std::vector<fs::path> paths;
  for (const std::string& file : files) paths.push_back(source / file);
  return paths;
}

}  // namespace

void load_hf_weights(const fs::path& source, Transformer& model) {
  HfLoad load;
  for (const fs::path& file : hf_weight_files(source, model.config())) {
    load_hf_file(file, model, load);
  }
  finish_hf_load(source, model, load);
}

HfWeightsSurvey survey_hf_weights(const fs::path& source, const ModelConfig& config) {
  HfWeightsSurvey survey;
  const ParameterRegistry registry(config);
  std::set<std::string> found;
  for (const fs::path& file : hf_weight_files(source, config)) {
    SafetensorsReader reader(file);
    for (const SafetensorsTensorInfo& t : reader.tensors()) {
      HfTensorSurvey entry;
      entry.file_name = t.name;
      entry.dtype = t.dtype;
      entry.shape = t.shape;
      entry.name = canonical_name(t.name, config);
      const int index = entry.name.empty() ? -1 : registry.find(entry.name);
      const bool zero_bias_candidate =
          config.family == ModelFamily::kGpt2 && !config.bias && ends_with(entry.name, ".bias");
      if (entry.name.empty() || (index < 0 && zero_bias_candidate)) {
        entry.kind = HfTensorSurvey::Kind::kSkipped;  // the load checks such biases are zero
      } else if (index < 0) {
        entry.kind = HfTensorSurvey::Kind::kUnexpected;
      } else {
        entry.expected = registry.at(index).shape;
        found.insert(entry.name);
        if (t.shape != entry.expected) {
          entry.kind = HfTensorSurvey::Kind::kMisshaped;
        } else if (t.dtype == DType::kF32) {
          entry.kind = HfTensorSurvey::Kind::kExact;
        } else if (t.dtype == DType::kBF16 || t.dtype == DType::kF16) {
          entry.kind = HfTensorSurvey::Kind::kWidened;
        } else {
          entry.kind = HfTensorSurvey::Kind::kRefused;
        }
      }
      survey.tensors.push_back(std::move(entry));
    }
  }
  for (const ParameterSpec& spec : registry.specs()) {
    if (!found.contains(spec.name)) {
      survey.missing.push_back(fmt::format("{} {}", spec.name, spec.shape.to_string()));
    }
  }
  return survey;
}

void export_hf(const fs::path& dir, Transformer& model, const HfExportOptions& options) {
  expect_unsharded_model(model.registry(), "a Hugging Face export",
                         "save a checkpoint (save_trainer_checkpoint) and export that: `lattice "
                         "export CKPT` loads every shard into one tp-1 model");
  LATTICE_CHECK(options.max_shard_bytes > 0, "export_hf: max_shard_bytes must be positive");
  const ModelConfig& c = model.config();
  nlohmann::json config = hf_config_json(c);
  if (c.moe() && c.capacity_factor > 0) {
    spdlog::warn(
        "{}: capacity_factor {} drops tokens past an expert's capacity; transformers' "
        "Mixtral is dropless, so its outputs differ where Lattice drops",
        c.name, c.capacity_factor);
  }
  fs::create_directories(dir);
  ParameterStore& store = model.parameters();
  const auto& specs = model.registry().specs();
  // Declared before the tensors that reference it, so it outlives them.
  Arena scratch("export");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int i = 0; i < int(specs.size()); ++i)
    tensors.emplace_back(specs[size_t(i)].name, store.master(i));
  // Hugging Face's GPT-2 always has biases; a model trained without them is the same function
  // with zero biases, so those are written as zeros (exact).
  if (c.family == ModelFamily::kGpt2 && !c.bias) {
    auto zeros = [&](const std::string& name, int64_t n) {
      tensors.emplace_back(name, Tensor::zeros(scratch, {n}, DType::kF32));
    };
    for (int64_t l = 0; l < c.n_layer; ++l) {
      std::string h = fmt::format("transformer.h.{}.", l);
      zeros(h + "ln_1.bias", c.d_model);
      zeros(h + "attn.c_attn.bias", c.d_model + 2 * c.kv_width());
      zeros(h + "attn.c_proj.bias", c.d_model);
      zeros(h + "ln_2.bias", c.d_model);
      zeros(h + "mlp.c_fc.bias", c.d_ff);
      zeros(h + "mlp.c_proj.bias", c.d_model);
    }
    zeros("transformer.ln_f.bias", c.d_model);
  }

  // The hub's layout (transformers' save_pretrained): tensors in order, a new file whenever the
  // next tensor would take the current one past the limit (a larger tensor gets a file of its
  // own), files model-0000k-of-0000n.safetensors and an index naming each tensor's file.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t total_bytes = 0, shard_bytes = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint64_t bytes = tensors[t].second.nbytes();
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  // What an earlier export left must not shadow this one (the loader prefers model.safetensors).
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool hf_weights = name == "model.safetensors" || name == "model.safetensors.index.json" ||
                            (name.starts_with("model-") && ends_with(name, ".safetensors"));
    if (hf_weights) fs::remove(entry.path());
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file = shards.size() == 1 ? std::string("model.safetensors")
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                                              k + 1, shards.size());
    SafetensorsWriter writer;
    writer.add_metadata("format", "pt");
    for (size_t t : shards[k]) {
      writer.add(tensors[t].first, tensors[t].second);
      weight_map[tensors[t].first] = file;
    }
    writer.write(dir / file);
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                                  {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    AtomicFileWriter out(dir / "model.safetensors.index.json");
    out.write(text.data(), text.size());
    out.commit();
  }
  std::string text = config.dump(2) + "\n";
  AtomicFileWriter out(dir / "config.json");
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace lattice
