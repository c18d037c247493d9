#include "model/parameters.h"

#include <cmath>

#include "core/philox.h"

namespace lattice {

ParameterRegistry::ParameterRegistry(const ModelConfig& c) {
  c.validate();
  const int64_t C = c.d_model, F = c.d_ff, V = c.vocab_size, KV = c.kv_width();
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const std::string root = gpt2 ? "transformer." : "model.";

  // Norm weights (and LayerNorm biases when the model has biases).
  auto add_norm = [&](const std::string& prefix) {
    add(prefix + ".weight", {C}, ParamInit::kOnes, false);
    if (c.norm == NormKind::kLayerNorm && c.bias)
      add(prefix + ".bias", {C}, ParamInit::kZeros, false);
  };
  // A linear map in -> out: GPT-2's Conv1D stores [in, out]; Llama's Linear stores [out, in].
  auto add_linear = [&](const std::string& prefix, int64_t in, int64_t out, ParamInit init) {
    add(prefix + ".weight", gpt2 ? Shape{in, out} : Shape{out, in}, init, true);
    if (c.bias) add(prefix + ".bias", {out}, ParamInit::kZeros, false);
  };

  add(root + (gpt2 ? "wte.weight" : "embed_tokens.weight"), {V, C}, ParamInit::kNormal, true);
  if (c.position == PositionKind::kLearned) {
    add(root + (gpt2 ? "wpe.weight" : "embed_positions.weight"), {c.seq_len, C}, ParamInit::kNormal,
        true);
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (gpt2) {
      std::string h = fmt::format("transformer.h.{}.", l);
      add_norm(h + "ln_1");
      add_linear(h + "attn.c_attn", C, C + 2 * KV, ParamInit::kNormal);
      add_linear(h + "attn.c_proj", C, C, ParamInit::kResidualNormal);
      add_norm(h + "ln_2");
      if (c.mlp == MlpKind::kGelu) {
        add_linear(h + "mlp.c_fc", C, F, ParamInit::kNormal);
      } else {
        add_linear(h + "mlp.c_fc", C, F, ParamInit::kNormal);   // gate
        add_linear(h + "mlp.c_fc2", C, F, ParamInit::kNormal);  // up
      }
      add_linear(h + "mlp.c_proj", F, C, ParamInit::kResidualNormal);
    } else {
      std::string h = fmt::format("model.layers.{}.", l);
      add_norm(h + "input_layernorm");
      add_linear(h + "self_attn.q_proj", C, C, ParamInit::kNormal);
      add_linear(h + "self_attn.k_proj", C, KV, ParamInit::kNormal);
      add_linear(h + "self_attn.v_proj", C, KV, ParamInit::kNormal);
      add_linear(h + "self_attn.o_proj", C, C, ParamInit::kResidualNormal);
      add_norm(h + "post_attention_layernorm");
      if (c.mlp == MlpKind::kSwiglu) {
        add_linear(h + "mlp.gate_proj", C, F, ParamInit::kNormal);
        add_linear(h + "mlp.up_proj", C, F, ParamInit::kNormal);
      } else {
        add_linear(h + "mlp.up_proj", C, F, ParamInit::kNormal);
      }
      add_linear(h + "mlp.down_proj", F, C, ParamInit::kResidualNormal);
    }
  }
  add_norm(gpt2 ? "transformer.ln_f" : "model.norm");
  if (!c.tied_embeddings) add("lm_head.weight", {V, C}, ParamInit::kNormal, true);
}

int ParameterRegistry::add(std::string name, Shape shape, ParamInit init, bool weight_decay) {
  int64_t numel = shape.numel();
  specs_.push_back(ParameterSpec{std::move(name), std::move(shape), init, weight_decay, total_});
  // Keep every parameter 16-element aligned so views start on 64-byte boundaries.
  total_ += (numel + 15) / 16 * 16;
  return int(specs_.size()) - 1;
}

int ParameterRegistry::find(std::string_view name) const {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == name) return int(i);
  }
  return -1;
}

void initial_values(const ParameterSpec& spec, const ModelConfig& config, uint64_t seed,
                    int64_t first, int64_t count, float* out) {
  switch (spec.init) {
    case ParamInit::kZeros:
      for (int64_t i = 0; i < count; ++i) out[i] = 0.0f;
      return;
    case ParamInit::kOnes:
      for (int64_t i = 0; i < count; ++i) out[i] = 1.0f;
      return;
    case ParamInit::kNormal:
      fill_normal(out, count, seed, hash_name(spec.name), first, 0.0f, config.init_std);
      return;
    case ParamInit::kResidualNormal:
      fill_normal(out, count, seed, hash_name(spec.name), first, 0.0f,
                  config.init_std / std::sqrt(2.0f * float(config.n_layer)));
      return;
  }
}

ParameterStore::ParameterStore(const ParameterRegistry& registry, Arena& arena, DType compute_dtype)
    : registry_(registry) {
  const int64_t P = registry.total_elements();
  master_ = Tensor::zeros(arena, {P}, DType::kF32, MemoryCategory::kParameters);
  grads_ = Tensor::zeros(arena, {P}, DType::kF32, MemoryCategory::kGradients);
  if (compute_dtype == DType::kF32) {
    compute_ = master_;
  } else if (compute_dtype == DType::kBF16) {
    compute_ = Tensor::zeros(arena, {P}, DType::kBF16, MemoryCategory::kParameters);
  } else {
    LATTICE_THROW(DTypeError, "compute dtype {} is not supported ---> HINT: use f32 or bf16",
                  dtype_name(compute_dtype));
  }
}

void ParameterStore::initialize(const ModelConfig& config, uint64_t seed) {
  for (const ParameterSpec& spec : registry_.specs()) {
    initial_values(spec, config, seed, 0, spec.shape.numel(), master_.data<float>() + spec.offset);
  }
  refresh_compute_copy();
}

void ParameterStore::refresh_compute_copy() {
  if (compute_.dtype() != DType::kF32) compute_.copy_from(master_);
}

Tensor ParameterStore::slice(const Tensor& flat, int index) const {
  const ParameterSpec& spec = registry_.at(index);
  return flat.slice_rows(spec.offset, spec.offset + spec.shape.numel()).view(spec.shape);
}

Tensor ParameterStore::master(int index) const {
  return slice(master_, index);
}
Tensor ParameterStore::grad(int index) const {
  return slice(grads_, index);
}
Tensor ParameterStore::compute(int index) const {
  return slice(compute_, index);
}

}  // namespace lattice
