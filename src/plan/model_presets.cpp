#include "plan/model_presets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "core/error.h"
#include "plan/model_file.h"

namespace lattice::plan {

// GPT-2 family (Radford et al. 2019): GELU MLP of 4h, LayerNorm, learned positions, biases,
// tied embeddings, vocab 50257 padded to 50304 (a multiple of 128).
ModelSpec gpt_model(std::string name, int64_t layers, int64_t heads, int64_t width, int64_t seq,
                    int64_t vocab, int64_t padded_vocab) {
  ModelSpec m;
  m.name = std::move(name);
  m.n_layers = layers;
  m.n_heads = m.n_kv_heads = heads;
  m.d_model = width;
  m.d_ff = 4 * width;
  m.vocab_size = vocab;
  m.padded_vocab_size = padded_vocab;
  m.max_seq_len = seq;
  return m;
}

// Llama family (Touvron et al. 2023; Llama 3 model card): RMSNorm, RoPE, SwiGLU, no biases,
// untied output projection.
ModelSpec llama_model(std::string name, int64_t layers, int64_t heads, int64_t kv_heads,
                      int64_t width, int64_t ffn, int64_t vocab, int64_t seq) {
  ModelSpec m;
  m.name = std::move(name);
  m.n_layers = layers;
  m.n_heads = heads;
  m.n_kv_heads = kv_heads;
  m.d_model = width;
  m.d_ff = ffn;
  m.vocab_size = m.padded_vocab_size = vocab;
  m.max_seq_len = seq;
  m.norm = NormKind::kRmsNorm;
  m.position = PositionKind::kRope;
  m.mlp = MlpKind::kSwiglu;
  m.biases = false;
  m.tied_embeddings = false;
  m.fused_qkv = false;
  return m;
}

// Mixtral (Jiang et al. 2024, "Mixtral of Experts", Table 1): the Llama block with every MLP
// E SwiGLU experts behind a top-k router.
ModelSpec mixtral_model(std::string name, int64_t layers, int64_t heads, int64_t kv_heads,
                        int64_t width, int64_t ffn, int64_t vocab, int64_t seq, int64_t experts,
                        int64_t top_k) {
  ModelSpec m = llama_model(std::move(name), layers, heads, kv_heads, width, ffn, vocab, seq);
  m.n_experts = experts;
  m.experts_per_token = top_k;
  return m;
}

namespace {

// Hugging Face's SmolLM-135M (HuggingFaceTB/SmolLM-135M config.json): a Llama of GPT-2 small's
// size with tied embeddings, the Llama preset `lattice bench train` compares with gpt2-124m.
ModelSpec smollm_135m() {
  ModelSpec m = llama_model("smollm-135m", 30, 9, 3, 576, 1536, 49152, 2048);
  m.tied_embeddings = true;
  return m;
}

std::vector<ModelSpec> all_presets() {
  constexpr int64_t kGptVocab = 50257, kGptPadded = 50304, kLlama3Vocab = 128256;
  return {
      gpt_model("gpt2-124m", 12, 12, 768, 1024, kGptVocab, kGptPadded),
      gpt_model("gpt2-350m", 24, 16, 1024, 1024, kGptVocab, kGptPadded),
      gpt_model("gpt2-774m", 36, 20, 1280, 1024, kGptVocab, kGptPadded),
      gpt_model("gpt2-1.5b", 48, 25, 1600, 1024, kGptVocab, kGptPadded),
      gpt_model("gpt3-175b", 96, 96, 12288, 2048, kGptVocab, kGptPadded),
      llama_model("llama-3-8b", 32, 32, 8, 4096, 14336, kLlama3Vocab, 8192),
      llama_model("llama-3-70b", 80, 64, 8, 8192, 28672, kLlama3Vocab, 8192),
      llama_model("llama-3-405b", 126, 128, 8, 16384, 53248, kLlama3Vocab, 8192),
      smollm_135m(),
      mixtral_model("mixtral-8x7b", 32, 32, 8, 4096, 14336, 32000, 32768, 8, 2),
      mixtral_model("mixtral-8x22b", 56, 48, 8, 6144, 16384, 32768, 65536, 8, 2),
      // The repository's own presets (byte-level vocabularies of 256).
      gpt_model("gpt2-tiny", 2, 4, 64, 64, 256, 256),
      gpt_model("shakespeare-char", 4, 4, 128, 64, 256, 256),
      llama_model("llama-tiny", 2, 4, 2, 64, 176, 256, 64),
      mixtral_model("mixtral-tiny", 2, 4, 2, 64, 96, 256, 64, 4, 2),
  };
}

}  // namespace

ModelSpec model_preset(std::string_view name) {
  for (ModelSpec& m : all_presets()) {
    if (m.name == name) return m;
  }
  LATTICE_THROW(ConfigError,
                "unknown model preset '{}' ---> HINT: use one of {} or a path to a "
                "model config file (.toml or Hugging Face config.json)",
                name, fmt::join(model_preset_names(), ", "));
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelSpec& m : all_presets()) names.push_back(m.name);
  return names;
}

ModelSpec resolve_model(const std::string& name_or_path) {
  for (const std::string& name : model_preset_names()) {
    if (name == name_or_path) return model_preset(name);
  }
  if (std::filesystem::exists(name_or_path)) return load_model_file(name_or_path);
  return model_preset(name_or_path);  // throws, listing the presets
}

}  // namespace lattice::plan
