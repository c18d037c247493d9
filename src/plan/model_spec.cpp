#include "plan/model_spec.h"

#include <algorithm>

#include "core/error.h"

namespace lattice::plan {

void validate(const ModelSpec& spec) {
  auto positive = [&](int64_t value, std::string_view field) {
    if (value <= 0) {
      LATTICE_THROW(ConfigError,
                    "model '{}': {} must be positive, got {} ---> HINT: set {} in "
                    "the model config",
                    spec.name, field, value, field);
    }
  };
  // Ceilings far above any trained model that keep the planner's products (parameters, FLOPs,
  // bytes) inside int64; a larger value is a typo or a hostile file, not a model.
  auto at_most = [&](int64_t value, int64_t limit, std::string_view field) {
    if (value > limit) {
      LATTICE_THROW(ConfigError,
                    "model '{}': {} = {} is larger than any model the planner can price (at "
                    "most {}) ---> HINT: check {} in the model config",
                    spec.name, field, value, limit, field);
    }
  };
  at_most(spec.n_layers, int64_t(1) << 16, "n_layers");
  at_most(spec.n_heads, int64_t(1) << 16, "n_heads");
  at_most(spec.n_kv_heads, int64_t(1) << 16, "n_kv_heads");
  at_most(spec.d_model, int64_t(1) << 20, "d_model");
  at_most(spec.d_ff, int64_t(1) << 22, "d_ff");
  at_most(spec.vocab_size, int64_t(1) << 31, "vocab_size");
  at_most(spec.padded_vocab_size, int64_t(1) << 31, "padded_vocab_size");
  at_most(spec.max_seq_len, int64_t(1) << 31, "max_seq_len");
  positive(spec.n_layers, "n_layers");
  positive(spec.n_heads, "n_heads");
  positive(spec.n_kv_heads, "n_kv_heads");
  positive(spec.d_model, "d_model");
  positive(spec.d_ff, "d_ff");
  positive(spec.vocab_size, "vocab_size");
  positive(spec.max_seq_len, "max_seq_len");
  if (spec.d_model % spec.n_heads != 0) {
    LATTICE_THROW(ConfigError,
                  "model '{}': d_model {} is not divisible by n_heads {} ---> HINT: "
                  "choose n_heads dividing d_model",
                  spec.name, spec.d_model, spec.n_heads);
  }
  if (spec.n_heads % spec.n_kv_heads != 0) {
    LATTICE_THROW(ConfigError,
                  "model '{}': n_heads {} is not a multiple of n_kv_heads {} "
                  "---> HINT: grouped-query attention needs n_kv_heads dividing n_heads",
                  spec.name, spec.n_heads, spec.n_kv_heads);
  }
  if (spec.n_experts < 0 || spec.n_experts > (int64_t(1) << 12) ||
      (spec.n_experts > 0 &&
       (spec.experts_per_token < 1 || spec.experts_per_token > spec.n_experts)) ||
      (spec.n_experts == 0 && spec.experts_per_token != 0)) {
    LATTICE_THROW(ConfigError,
                  "model '{}': n_experts {} with experts_per_token {} ---> HINT: a sparse model "
                  "has 1 <= experts_per_token <= n_experts <= 4096; a dense one sets both to 0",
                  spec.name, spec.n_experts, spec.experts_per_token);
  }
  // The experts multiply a layer's MLP: their count must stay inside int64 too (each factor's
  // ceiling above keeps a dense model's under 2^60).
  if (double(spec.n_layers) * double(std::max<int64_t>(1, spec.n_experts)) * 3.0 *
          double(spec.d_model) * double(spec.d_ff) >
      1e18) {
    LATTICE_THROW(ConfigError,
                  "model '{}': {} layers of {} experts of {} × {} are larger than any model the "
                  "planner can price (over 10^18 parameters) ---> HINT: check n_layers, "
                  "n_experts, d_model and d_ff in the model config",
                  spec.name, spec.n_layers, spec.n_experts, spec.d_model, spec.d_ff);
  }
  if (spec.n_experts > 0 && spec.biases) {
    LATTICE_THROW(ConfigError,
                  "model '{}': mixture-of-experts layers have no biases (Mixtral's, Lattice's) "
                  "---> HINT: set biases = false with n_experts > 0",
                  spec.name);
  }
  if (spec.padded_vocab_size < spec.vocab_size) {
    LATTICE_THROW(ConfigError,
                  "model '{}': padded_vocab_size {} is smaller than vocab_size {} "
                  "---> HINT: omit it to use vocab_size",
                  spec.name, spec.padded_vocab_size, spec.vocab_size);
  }
}

ParameterCounts count_parameters(const ModelSpec& spec, bool use_padded_vocab) {
  const int64_t h = spec.d_model, ffn = spec.d_ff, kv = spec.kv_dim();
  const int64_t vocab = use_padded_vocab ? spec.padded_vocab_size : spec.vocab_size;
  // Weight, and a LayerNorm's bias unless the model has no biases at all (nanoGPT's bias=False,
  // Lattice's model.bias: one switch for the linear and the LayerNorm biases).
  const int64_t norm = spec.norm == NormKind::kLayerNorm && spec.biases ? 2 * h : h;

  ParameterCounts counts;
  // Attention: fused QKV (h → h + 2·kv), output projection (h → h).
  int64_t attention = h * (h + 2 * kv) + h * h;
  // MLP: up (h → ffn, twice for SwiGLU's gate), down (ffn → h).
  int64_t mlp = (spec.mlp == MlpKind::kSwiglu ? 3 : 2) * h * ffn;
  int64_t replicated = 2 * norm;
  if (spec.biases) {
    attention += (h + 2 * kv) + h;
    mlp += ffn + h;
    replicated += 2 * h;  // row-parallel output biases are added after the all-reduce
  }
  counts.per_layer = attention + mlp + 2 * norm;
  counts.per_layer_replicated = replicated;
  counts.per_layer_active = counts.per_layer;
  if (spec.moe()) {
    counts.per_layer_router = h * spec.n_experts;
    counts.per_layer_experts = spec.n_experts * mlp;
    counts.per_layer = attention + counts.per_layer_router + counts.per_layer_experts + 2 * norm;
    counts.per_layer_active =
        attention + counts.per_layer_router + spec.experts_per_token * mlp + 2 * norm;
  }
  counts.embedding =
      vocab * h + (spec.position == PositionKind::kLearned ? spec.max_seq_len * h : 0);
  counts.output = spec.tied_embeddings ? 0 : vocab * h;
  counts.final_norm = norm;
  const int64_t ends = counts.embedding + counts.output + counts.final_norm;
  counts.total = spec.n_layers * counts.per_layer + ends;
  counts.active = spec.n_layers * counts.per_layer_active + ends;
  return counts;
}

}  // namespace lattice::plan
