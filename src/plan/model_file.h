// Model config files for the planner.
//
// TOML (keys at the top level or under [model]); every key optional when `preset` names a base:
//   preset = "gpt2-124m"       n_layers = 12      n_heads = 12     n_kv_heads = 12
//   d_model = 768              d_ff = 3072        vocab_size = 50257
//   padded_vocab_size = 50304  seq_len = 1024     norm = "layernorm" | "rmsnorm"
//   position = "learned" | "rope"                 activation = "gelu" | "swiglu"
//   bias = true                tied_embeddings = true                name = "my-model"
// JSON: a Hugging Face config.json (GPT-2 keys n_layer/n_head/n_embd/n_positions or Llama keys
// num_hidden_layers/hidden_size/num_attention_heads/num_key_value_heads/intermediate_size).
#pragma once

#include <string>

#include "plan/model_spec.h"

namespace lattice::plan {

// Throws IoError when the file cannot be read, ConfigError naming the key when it is malformed.
ModelSpec load_model_file(const std::string& path);
ModelSpec parse_model_toml(const std::string& text, const std::string& origin);
ModelSpec parse_model_hf_json(const std::string& text, const std::string& origin);

}  // namespace lattice::plan
