// The planner's description of a transformer: only what its memory, FLOPs and communication
// depend on. The trainer's config is mapped onto this struct; the planner never builds a model.
//
// Notation (cost-model reference): l layers, h = d_model, a query heads, g key/value heads,
// ffn = d_ff, V vocabulary, s sequence length.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "spec/model_kinds.h"

namespace lattice::plan {

// The model's switches are the runtime's own (spec/model_kinds.h).
using lattice::mlp_name;
using lattice::MlpKind;
using lattice::norm_name;
using lattice::NormKind;
using lattice::position_name;
using lattice::PositionKind;

struct ModelSpec {
  std::string name;
  int64_t n_layers = 0;    // l
  int64_t n_heads = 0;     // a
  int64_t n_kv_heads = 0;  // g (== a without grouped-query attention)
  int64_t d_model = 0;     // h
  int64_t d_ff = 0;        // ffn
  int64_t vocab_size = 0;  // V as the tokenizer defines it
  // Rows of the embedding table actually stored: V rounded up so it shards and tiles well
  // (GPT-2's 50257 → 50304). Memory and FLOPs use this one.
  int64_t padded_vocab_size = 0;
  int64_t max_seq_len = 0;  // learned position table rows; the default training length
  NormKind norm = NormKind::kLayerNorm;
  PositionKind position = PositionKind::kLearned;
  MlpKind mlp = MlpKind::kGelu;
  bool biases = true;  // linear biases and LayerNorm biases (one switch, as nanoGPT's bias)
  bool tied_embeddings = true;
  // One fused QKV projection (GPT-2's c_attn) rather than separate q, k, v (Llama). Only the
  // Lattice runtime's activation accounting depends on it (it keeps the fused output as well).
  bool fused_qkv = true;
  // Mixture of experts (Mixtral's sparse MLP, docs/moe.md): every layer's MLP is n_experts
  // experts of d_ff each behind a router (d_model → n_experts, replicated over tp), a token
  // meeting experts_per_token of them. 0: a dense MLP.
  int64_t n_experts = 0;
  int64_t experts_per_token = 0;

  bool moe() const { return n_experts > 0; }
  int64_t head_dim() const { return d_model / n_heads; }
  int64_t kv_dim() const { return n_kv_heads * head_dim(); }  // width of K (and of V)
};

// Throws ConfigError naming the field and the fix when the spec cannot describe a model.
void validate(const ModelSpec& spec);

// Parameter counts, exact (Megatron theoretical_memory_usage.py generalised): attention
// h·(h + 2·kv) + h·h, MLP 2·h·ffn (GELU) or 3·h·ffn (SwiGLU), two norms per layer, a final norm,
// token embedding V·h (twice when untied), learned positions s·h. A sparse layer's MLP is E
// such experts (without biases, as Mixtral's) and a router h·E.
struct ParameterCounts {
  int64_t per_layer = 0;             // one transformer block
  int64_t per_layer_replicated = 0;  // its part that tensor parallelism does not split (norms,
                                     // row-parallel biases)
  int64_t per_layer_router = 0;      // the router (in per_layer, replicated over tp)
  int64_t per_layer_experts = 0;     // the E experts (in per_layer; split over tp and ep)
  int64_t per_layer_active = 0;      // what one token's forward uses: k of the E experts
  int64_t embedding = 0;             // token (+ position) table, on the first stage
  int64_t output = 0;                // untied output projection, on the last stage (0 if tied)
  int64_t final_norm = 0;            // on the last stage
  int64_t total = 0;                 // counting tied weights once
  int64_t active = 0;                // total with per_layer_active for per_layer (MoE FLOPs)
};

// use_padded_vocab: count the stored table (true, for memory) or the tokenizer's V (false, the
// convention of published parameter counts).
ParameterCounts count_parameters(const ModelSpec& spec, bool use_padded_vocab = true);

}  // namespace lattice::plan
