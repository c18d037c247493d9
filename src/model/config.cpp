#include "model/config.h"

#include "core/error.h"

namespace lattice {

namespace {

ModelConfig gpt2(std::string name, int64_t n_layer, int64_t n_head, int64_t d_model, int64_t vocab,
                 int64_t seq_len) {
  ModelConfig c;
  c.name = std::move(name);
  c.family = ModelFamily::kGpt2;
  c.vocab_size = vocab;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_kv_head = n_head;
  c.d_model = d_model;
  c.d_ff = 4 * d_model;
  c.seq_len = seq_len;
  return c;
}

ModelConfig llama(std::string name, int64_t n_layer, int64_t n_head, int64_t n_kv_head,
                  int64_t d_model, int64_t d_ff, int64_t vocab, int64_t seq_len) {
  ModelConfig c;
  c.name = std::move(name);
  c.family = ModelFamily::kLlama;
  c.vocab_size = vocab;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_kv_head = n_kv_head;
  c.d_model = d_model;
  c.d_ff = d_ff;
  c.seq_len = seq_len;
  c.norm = NormKind::kRmsNorm;
  c.norm_eps = 1e-5f;
  c.position = PositionKind::kRope;
  c.mlp = MlpKind::kSwiglu;
  c.bias = false;
  c.tied_embeddings = false;
  return c;
}

}  // namespace

void ModelConfig::validate() const {
  auto positive = [](int64_t v, std::string_view field) {
    if (v <= 0) LATTICE_THROW(ConfigError, "model.{} = {} must be positive", field, v);
  };
  positive(vocab_size, "vocab_size");
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(n_kv_head, "n_kv_head");
  positive(d_model, "d_model");
  positive(d_ff, "d_ff");
  positive(seq_len, "seq_len");
  if (d_model % n_head != 0) {
    LATTICE_THROW(ConfigError,
                  "model.d_model = {} is not divisible by model.n_head = {} ---> HINT: the head "
                  "size is d_model / n_head; pick n_head dividing d_model",
                  d_model, n_head);
  }
  if (n_head % n_kv_head != 0) {
    LATTICE_THROW(ConfigError,
                  "model.n_head = {} is not a multiple of model.n_kv_head = {} ---> HINT: each kv "
                  "head serves n_head / n_kv_head query heads",
                  n_head, n_kv_head);
  }
  if (position == PositionKind::kRope && head_size() % 2 != 0) {
    LATTICE_THROW(ConfigError, "rotary positions need an even head size, got {}", head_size());
  }
  if (n_experts < 0) LATTICE_THROW(ConfigError, "model.n_experts = {} must be >= 0", n_experts);
  if (moe()) {
    if (family != ModelFamily::kLlama) {
      LATTICE_THROW(ConfigError,
                    "model.n_experts = {} on the {} family ---> HINT: mixture-of-experts layers "
                    "follow Mixtral's layout: set model.family = \"llama\" (or model.preset = "
                    "\"mixtral-tiny\")",
                    n_experts, family_name(family));
    }
    if (experts_per_token < 1 || experts_per_token > n_experts) {
      LATTICE_THROW(ConfigError,
                    "model.experts_per_token = {} must be between 1 and model.n_experts = {}",
                    experts_per_token, n_experts);
    }
    if (!(moe_aux_loss >= 0.0f) || !(moe_z_loss >= 0.0f) || !(capacity_factor >= 0.0f)) {
      LATTICE_THROW(ConfigError,
                    "model.moe_aux_loss = {}, model.moe_z_loss = {} and model.capacity_factor = "
                    "{} must be >= 0 (capacity_factor 0: dropless)",
                    moe_aux_loss, moe_z_loss, capacity_factor);
    }
  }
  if (vocab_size > 65536) {
    LATTICE_THROW(ConfigError,
                  "model.vocab_size = {} exceeds 65536, the limit of uint16 token files",
                  vocab_size);
  }
}

ModelConfig model_preset(std::string_view name) {
  if (name == "gpt2-124m") return gpt2("gpt2-124m", 12, 12, 768, 50257, 1024);
  if (name == "gpt2-tiny") {
    ModelConfig c = gpt2("gpt2-tiny", 2, 4, 64, 256, 64);
    return c;
  }
  if (name == "shakespeare-char") return gpt2("shakespeare-char", 4, 4, 128, 256, 64);
  if (name == "llama-tiny") return llama("llama-tiny", 2, 4, 2, 64, 176, 256, 64);
  if (name == "smollm-135m") {
    // Hugging Face's SmolLM-135M (HuggingFaceTB/SmolLM-135M config.json): the Llama block at
    // GPT-2 small's size, grouped-query attention 9:3 and tied embeddings.
    ModelConfig c = llama("smollm-135m", 30, 9, 3, 576, 1536, 49152, 2048);
    c.tied_embeddings = true;
    return c;
  }
  if (name == "mixtral-tiny") {
    // Mixtral's shape scaled down: 4 experts of 96 hidden features, top-2, per layer.
    ModelConfig c = llama("mixtral-tiny", 2, 4, 2, 64, 96, 256, 64);
    c.n_experts = 4;
    c.experts_per_token = 2;
    c.moe_aux_loss = 0.01f;
    c.moe_z_loss = 0.001f;
    return c;
  }
  std::string valid;
  for (const auto& n : model_preset_names()) valid += valid.empty() ? n : ", " + n;
  LATTICE_THROW(ConfigError, "unknown model preset '{}' ---> HINT: use one of {}", name, valid);
}

std::vector<std::string> model_preset_names() {
  return {"gpt2-124m",   "gpt2-tiny",    "llama-tiny",
          "smollm-135m", "mixtral-tiny", "shakespeare-char"};
}

}  // namespace lattice
