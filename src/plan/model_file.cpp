#include "plan/model_file.h"

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json_field.h"
#include "plan/model_presets.h"

namespace lattice::plan {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    LATTICE_THROW(IoError,
                  "cannot read model config '{}' ---> HINT: check the path, or use a "
                  "preset name",
                  path);
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

template <typename Enum>
Enum parse_choice(const std::string& value, const std::string& key, const std::string& origin,
                  std::initializer_list<std::pair<std::string_view, Enum>> choices) {
  std::string valid;
  for (const auto& [name, kind] : choices) {
    if (value == name) return kind;
    valid += (valid.empty() ? "" : ", ") + std::string(name);
  }
  LATTICE_THROW(ConfigError, "{}: {} = '{}' is not valid ---> HINT: use one of {}", origin, key,
                value, valid);
}

void finish(ModelSpec& m, const std::string& origin) {
  if (m.name.empty()) m.name = std::filesystem::path(origin).stem().string();
  if (m.n_kv_heads == 0) m.n_kv_heads = m.n_heads;
  // validate() bounds d_model; the default is derived only from a value it will accept.
  if (m.d_ff == 0 && m.d_model <= (int64_t(1) << 20)) m.d_ff = 4 * m.d_model;
  if (m.padded_vocab_size == 0) m.padded_vocab_size = m.vocab_size;
  validate(m);
}

}  // namespace

ModelSpec parse_model_toml(const std::string& text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    LATTICE_THROW(ConfigError, "{}: not valid TOML: {} (line {})", origin, e.description(),
                  e.source().begin.line);
  }
  const toml::table* table = root["model"].as_table() ? root["model"].as_table() : &root;

  ModelSpec m;
  if (auto preset = (*table)["preset"].value<std::string>()) m = model_preset(*preset);
  auto integer = [&](const char* key, int64_t& field) {
    const toml::node* node = table->get(key);
    if (!node) return;
    // Only an integer node: value<int64_t>() would also convert a float, undefined behaviour
    // out of range (6e+82, found by model_file_fuzz).
    const toml::value<int64_t>* value = node->as_integer();
    if (value == nullptr) LATTICE_THROW(ConfigError, "{}: {} must be an integer", origin, key);
    field = value->get();
  };
  auto boolean = [&](const char* key, bool& field) {
    const toml::node* node = table->get(key);
    if (!node) return;
    auto value = node->value<bool>();
    if (!value) LATTICE_THROW(ConfigError, "{}: {} must be true or false", origin, key);
    field = *value;
  };
  if (auto name = (*table)["name"].value<std::string>()) m.name = *name;
  integer("n_layers", m.n_layers);
  integer("n_heads", m.n_heads);
  integer("n_kv_heads", m.n_kv_heads);
  integer("d_model", m.d_model);
  integer("d_ff", m.d_ff);
  integer("vocab_size", m.vocab_size);
  integer("padded_vocab_size", m.padded_vocab_size);
  integer("seq_len", m.max_seq_len);
  integer("max_seq_len", m.max_seq_len);
  integer("n_experts", m.n_experts);
  integer("experts_per_token", m.experts_per_token);
  boolean("bias", m.biases);
  boolean("tied_embeddings", m.tied_embeddings);
  if (auto v = (*table)["norm"].value<std::string>()) {
    m.norm = parse_choice<NormKind>(
        *v, "norm", origin, {{"layernorm", NormKind::kLayerNorm}, {"rmsnorm", NormKind::kRmsNorm}});
  }
  if (auto v = (*table)["position"].value<std::string>()) {
    m.position = parse_choice<PositionKind>(
        *v, "position", origin,
        {{"learned", PositionKind::kLearned}, {"rope", PositionKind::kRope}});
  }
  if (auto v = (*table)["activation"].value<std::string>()) {
    m.mlp = parse_choice<MlpKind>(*v, "activation", origin,
                                  {{"gelu", MlpKind::kGelu}, {"swiglu", MlpKind::kSwiglu}});
  }
  finish(m, origin);
  return m;
}

namespace {

ModelSpec parse_hf_fields(const std::string& text, const std::string& origin) {
  const nlohmann::json document = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded() || !document.is_object()) {
    LATTICE_THROW(ConfigError, "{}: not a JSON object ---> HINT: pass a Hugging Face config.json",
                  origin);
  }
  const JsonField j(document, origin, "pass a Hugging Face config.json as the hub writes it");
  // The first of `keys` the file has (transformers' name, then GPT-2's); 0 when none.
  auto integer = [&](std::initializer_list<const char*> keys) -> int64_t {
    for (const char* key : keys) {
      if (const std::optional<JsonField> field = j.find(key); field && !field->is_null()) {
        return field->integer();
      }
    }
    return 0;
  };
  ModelSpec m;
  m.name = j.string_or("_name_or_path", "");
  m.n_layers = integer({"num_hidden_layers", "n_layer"});
  m.n_heads = integer({"num_attention_heads", "n_head"});
  m.n_kv_heads = integer({"num_key_value_heads"});
  m.d_model = integer({"hidden_size", "n_embd"});
  m.d_ff = integer({"intermediate_size", "n_inner"});
  m.vocab_size = integer({"vocab_size"});
  m.max_seq_len = integer({"max_position_embeddings", "n_positions"});
  const std::string type = j.string_or("model_type", "");
  if (type == "gpt2") {
    // GPT-2 code pads nothing; Megatron-style training pads to a multiple of 128.
    m.padded_vocab_size = (m.vocab_size + 127) / 128 * 128;
  } else {
    // Llama, Mistral, Qwen and relatives: RMSNorm, RoPE, SwiGLU, no biases.
    m.norm = NormKind::kRmsNorm;
    m.position = PositionKind::kRope;
    m.mlp = MlpKind::kSwiglu;
    m.biases = j.boolean_or("attention_bias", false);
    m.tied_embeddings = j.boolean_or("tie_word_embeddings", false);
    m.fused_qkv = false;
    // Mixtral and relatives: every MLP a set of experts behind a top-k router.
    m.n_experts = integer({"num_local_experts"});
    m.experts_per_token = integer({"num_experts_per_tok"});
  }
  finish(m, origin);
  return m;
}

}  // namespace

ModelSpec parse_model_hf_json(const std::string& text, const std::string& origin) {
  return parse_hf_fields(text, origin);
}

ModelSpec load_model_file(const std::string& path) {
  const std::string text = read_text(path);
  if (std::filesystem::path(path).extension() == ".json") return parse_model_hf_json(text, path);
  return parse_model_toml(text, path);
}

}  // namespace lattice::plan
