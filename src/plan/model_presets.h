// Built-in model presets: the published GPT-2/GPT-3/Llama-3 shapes and the repository's own
// tiny presets (the trainer's configs of the same names).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "plan/model_spec.h"

namespace lattice::plan {

// GPT-2 family (Radford et al. 2019): GELU MLP of 4h, LayerNorm, learned positions, biases, tied
// embeddings.
ModelSpec gpt_model(std::string name, int64_t layers, int64_t heads, int64_t width, int64_t seq,
                    int64_t vocab, int64_t padded_vocab);
// Llama family: RMSNorm, RoPE, SwiGLU, no biases, untied output projection, separate q, k, v.
ModelSpec llama_model(std::string name, int64_t layers, int64_t heads, int64_t kv_heads,
                      int64_t width, int64_t ffn, int64_t vocab, int64_t seq);

// Throws ConfigError listing the known names when `name` is not a preset.
ModelSpec model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// A preset name, or else a path to a model config file (model_file.h).
ModelSpec resolve_model(const std::string& name_or_path);

}  // namespace lattice::plan
