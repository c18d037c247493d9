// The transformer's configuration: one architecture whose switches span the GPT-2 and Llama
// families, plus the named presets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "spec/model_kinds.h"

namespace lattice {

struct ModelConfig {
  std::string name = "custom";
  ModelFamily family = ModelFamily::kGpt2;
  int64_t vocab_size = 256;
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_kv_head = 4;  // grouped-query attention when < n_head
  int64_t d_model = 64;
  int64_t d_ff = 256;
  int64_t seq_len = 64;  // maximum context (rows of the learned position table)
  NormKind norm = NormKind::kLayerNorm;
  float norm_eps = 1e-5f;
  PositionKind position = PositionKind::kLearned;
  float rope_theta = 10000.0f;
  MlpKind mlp = MlpKind::kGelu;
  bool bias = true;
  bool tied_embeddings = true;
  float init_std = 0.02f;
  // Mixture of experts (Mixtral's sparse MLP, docs/moe.md): 0 is the dense MLP. Each layer's
  // MLP becomes n_experts experts of d_ff hidden features (no biases); a router (d_model ->
  // n_experts) sends each token to its experts_per_token best, weighted by the softmax of their
  // logits. moe_aux_loss: the load-balancing loss's coefficient (Switch form, per sequence);
  // moe_z_loss: the router z-loss's; capacity_factor 0: dropless, else each expert takes at
  // most ceil(factor · T · k / E) tokens of a sequence (later positions dropped).
  int64_t n_experts = 0;
  int64_t experts_per_token = 2;
  float moe_aux_loss = 0.0f;
  float moe_z_loss = 0.0f;
  float capacity_factor = 0.0f;

  bool moe() const { return n_experts > 0; }
  int64_t head_size() const { return d_model / n_head; }
  int64_t kv_width() const { return n_kv_head * head_size(); }
  // Throws ConfigError naming the field and the fix when the switches are inconsistent.
  void validate() const;
};

ModelConfig model_preset(std::string_view name);  // throws ConfigError listing the presets
std::vector<std::string> model_preset_names();

}  // namespace lattice
