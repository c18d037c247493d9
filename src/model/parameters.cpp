#include "model/parameters.h"

#include <algorithm>
#include <cmath>

#include "core/philox.h"

namespace lattice {

void validate_tensor_parallel(const ModelConfig& c, const TensorParallelLayout& tp) {
  c.validate();
  const int n = tp.size;
  if (n < 1 || tp.rank < 0 || tp.rank >= n) {
    LATTICE_THROW(ConfigError, "tensor-parallel rank {} of {} ---> HINT: --tp must be at least 1",
                  tp.rank, n);
  }
  if (c.n_head % n != 0) {
    LATTICE_THROW(ConfigError,
                  "model '{}' has {} attention heads, which do not split over --tp {} ---> HINT: "
                  "choose a --tp that divides n_head ({})",
                  c.name, c.n_head, n, c.n_head);
  }
  if (c.n_kv_head % n != 0 && n % c.n_kv_head != 0) {
    LATTICE_THROW(ConfigError,
                  "model '{}' has {} kv heads: --tp {} neither divides them nor is a multiple of "
                  "them ---> HINT: choose a --tp that divides n_kv_head or that n_kv_head divides",
                  c.name, c.n_kv_head, n);
  }
  if (c.n_kv_head % n != 0 && c.family == ModelFamily::kGpt2) {
    LATTICE_THROW(ConfigError,
                  "model '{}' (gpt2 family, fused c_attn) has {} kv heads that do not split over "
                  "--tp {} ---> HINT: choose a --tp that divides n_kv_head; replicated kv heads "
                  "need the separate k/v projections of the llama family",
                  c.name, c.n_kv_head, n);
  }
  if (c.d_ff % n != 0) {
    LATTICE_THROW(ConfigError,
                  "model '{}' has d_ff {}, which does not split over --tp {} ---> HINT: choose a "
                  "--tp that divides d_ff",
                  c.name, c.d_ff, n);
  }
}

bool ModelPart::holds_layer(int64_t layer) const {
  for (const LayerChunk& c : chunks) {
    if (layer >= c.first_layer && layer < c.last_layer) return true;
  }
  return false;
}

bool ModelPart::has_embedding() const {
  for (const LayerChunk& c : chunks) {
    if (c.embedding) return true;
  }
  return false;
}

bool ModelPart::has_head() const {
  for (const LayerChunk& c : chunks) {
    if (c.head) return true;
  }
  return false;
}

ModelPart whole_model(const ModelConfig& config) {
  return ModelPart{{LayerChunk{0, config.n_layer, true, true}}};
}

ParameterRegistry::ParameterRegistry(const ModelConfig& c, TensorParallelLayout tp,
                                     const ModelPart& part, ExpertLayout ep)
    : tp_(tp), ep_(ep), part_(part.chunks.empty() ? whole_model(c) : part) {
  LATTICE_CHECK(ep.size >= 1 && (c.n_experts == 0 || c.n_experts % ep.size == 0),
                "{} experts over {} expert-parallel ranks", c.n_experts, ep.size);
  validate_tensor_parallel(c, tp);
  for (const LayerChunk& chunk : part_.chunks) {
    LATTICE_CHECK(0 <= chunk.first_layer && chunk.first_layer <= chunk.last_layer &&
                      chunk.last_layer <= c.n_layer,
                  "chunk layers [{}, {}) outside the model's {} layers", chunk.first_layer,
                  chunk.last_layer, c.n_layer);
  }
  const int64_t C = c.d_model, F = c.d_ff, V = c.vocab_size, KV = c.kv_width();
  const int64_t HS = c.head_size();
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const std::string root = gpt2 ? "transformer." : "model.";
  const int n = tp.size, r = tp.rank;
  const bool sp = tp.sequence_parallel && n > 1;

  heads_.q_heads = c.n_head / n;
  heads_.q_head_first = heads_.q_heads * r;
  heads_.kv_replicated = c.n_kv_head % n != 0;
  if (heads_.kv_replicated) {
    // n is a multiple of n_kv_head: this rank's query heads share one kv head.
    heads_.kv_heads = 1;
    heads_.kv_head_first = heads_.q_head_first / (c.n_head / c.n_kv_head);
  } else {
    heads_.kv_heads = c.n_kv_head / n;
    heads_.kv_head_first = heads_.kv_heads * r;
  }
  const ShardSpec vocab = n == 1 ? replicated_shard() : padded_split_shard(0, V, n, r);
  vocab_start_ = n == 1 ? 0 : vocab.pieces[0].begin;
  vocab_valid_ = n == 1 ? V : vocab.pieces[0].length;

  // The output features of a column-parallel map, split by heads (q) or evenly (MLP).
  auto column = [&](int64_t features) -> ShardPiece { return {features / n * r, features / n}; };
  const ShardPiece q_cols = column(C);
  const ShardPiece kv_cols{heads_.kv_head_first * HS, heads_.kv_heads * HS};
  const ShardPiece ff_cols = column(F);
  auto split = [&](int dim, std::vector<ShardPiece> pieces) {
    return n == 1 ? replicated_shard() : ShardSpec{dim, std::move(pieces), 0};
  };

  // Norm weights (and LayerNorm biases): replicated; under sequence parallelism each rank sees
  // only its token rows, so their gradients are partial.
  auto add_norm = [&](const std::string& prefix) {
    add(prefix + ".weight", {C}, ParamInit::kOnes, false, replicated_shard(), sp);
    if (c.norm == NormKind::kLayerNorm && c.bias)
      add(prefix + ".bias", {C}, ParamInit::kZeros, false, replicated_shard(), sp);
  };
  // GPT-2's Conv1D stores [in, out]; Llama's Linear stores [out, in].
  const int out_dim = gpt2 ? 1 : 0, in_dim = gpt2 ? 0 : 1;
  auto weight_shape = [&](int64_t in, int64_t out) {
    return gpt2 ? Shape{in, out} : Shape{out, in};
  };
  // Column-parallel: output features split (weight and bias alike).
  auto add_column = [&](const std::string& prefix, int64_t in, int64_t out,
                        std::vector<ShardPiece> pieces, ParamInit init) {
    add(prefix + ".weight", weight_shape(in, out), init, true, split(out_dim, pieces), false);
    if (c.bias) add(prefix + ".bias", {out}, ParamInit::kZeros, false, split(0, pieces), false);
  };
  // Row-parallel: input features split; the bias is added once, after the reduction.
  auto add_row = [&](const std::string& prefix, int64_t in, int64_t out, ShardPiece piece) {
    add(prefix + ".weight", weight_shape(in, out), ParamInit::kResidualNormal, true,
        split(in_dim, {piece}), false);
    if (c.bias) add(prefix + ".bias", {out}, ParamInit::kZeros, false, replicated_shard(), sp);
  };
  // Replicated kv projections: every rank holds all kv heads and uses one; the gradients of
  // the heads a rank does not use are zero there, so the group sum is the full gradient.
  auto add_kv = [&](const std::string& prefix) {
    if (!heads_.kv_replicated) {
      add_column(prefix, C, KV, {kv_cols}, ParamInit::kNormal);
      return;
    }
    add(prefix + ".weight", weight_shape(C, KV), ParamInit::kNormal, true, replicated_shard(),
        true);
    if (c.bias) add(prefix + ".bias", {KV}, ParamInit::kZeros, false, replicated_shard(), true);
  };

  const std::string token_table = root + (gpt2 ? "wte.weight" : "embed_tokens.weight");
  if (part_.has_embedding()) {
    add(token_table, {V, C}, ParamInit::kNormal, true, vocab, false);
    if (c.position == PositionKind::kLearned) {
      add(root + (gpt2 ? "wpe.weight" : "embed_positions.weight"), {c.seq_len, C},
          ParamInit::kNormal, true, replicated_shard(), sp);
    }
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!part_.holds_layer(l)) continue;
    adding_layer_ = l;
    if (gpt2) {
      std::string h = fmt::format("transformer.h.{}.", l);
      add_norm(h + "ln_1");
      // Fused [q | k | v] columns: each rank takes its heads' columns of each part.
      add_column(
          h + "attn.c_attn", C, C + 2 * KV,
          {q_cols, {C + kv_cols.begin, kv_cols.length}, {C + KV + kv_cols.begin, kv_cols.length}},
          ParamInit::kNormal);
      add_row(h + "attn.c_proj", C, C, q_cols);
      add_norm(h + "ln_2");
      add_column(h + "mlp.c_fc", C, F, {ff_cols}, ParamInit::kNormal);  // GELU, or SwiGLU's gate
      if (c.mlp == MlpKind::kSwiglu)
        add_column(h + "mlp.c_fc2", C, F, {ff_cols}, ParamInit::kNormal);
      add_row(h + "mlp.c_proj", F, C, ff_cols);
    } else {
      std::string h = fmt::format("model.layers.{}.", l);
      add_norm(h + "input_layernorm");
      add_column(h + "self_attn.q_proj", C, C, {q_cols}, ParamInit::kNormal);
      add_kv(h + "self_attn.k_proj");
      add_kv(h + "self_attn.v_proj");
      add_row(h + "self_attn.o_proj", C, C, q_cols);
      add_norm(h + "post_attention_layernorm");
      if (c.moe()) {
        // Mixtral: the router is replicated (every tp rank routes the same tokens); each
        // expert's w1 (gate) and w3 (up) are column-parallel and w2 (down) row-parallel, as the
        // dense MLP's maps. No biases.
        const std::string moe = h + "block_sparse_moe.";
        add(moe + "gate.weight", {c.n_experts, C}, ParamInit::kNormal, true, replicated_shard(),
            false);
        const int64_t first = ep.first(c.n_experts);
        for (int64_t e = first; e < first + ep.count(c.n_experts); ++e) {
          const std::string expert = fmt::format("{}experts.{}.", moe, e);
          add(expert + "w1.weight", {F, C}, ParamInit::kNormal, true, split(0, {ff_cols}), false);
          specs_.back().expert = true;
          add(expert + "w2.weight", {C, F}, ParamInit::kResidualNormal, true, split(1, {ff_cols}),
              false);
          specs_.back().expert = true;
          if (c.mlp == MlpKind::kSwiglu) {
            add(expert + "w3.weight", {F, C}, ParamInit::kNormal, true, split(0, {ff_cols}), false);
            specs_.back().expert = true;
          }
        }
        continue;
      }
      if (c.mlp == MlpKind::kSwiglu) {
        add_column(h + "mlp.gate_proj", C, F, {ff_cols}, ParamInit::kNormal);
      }
      add_column(h + "mlp.up_proj", C, F, {ff_cols}, ParamInit::kNormal);
      add_row(h + "mlp.down_proj", F, C, ff_cols);
    }
  }
  adding_layer_ = -1;
  if (!part_.has_head()) return;
  add_norm(gpt2 ? "transformer.ln_f" : "model.norm");
  if (!c.tied_embeddings) {
    add("lm_head.weight", {V, C}, ParamInit::kNormal, true, vocab, false);
  } else if (!part_.has_embedding()) {
    add(token_table, {V, C}, ParamInit::kNormal, true, vocab, false);
    specs_.back().tied_copy = true;
    specs_.back().read_as_f32 = false;  // the last stage uses it in the head's matmul only
  }
}

int ParameterRegistry::add(std::string name, Shape shape, ParamInit init, bool weight_decay,
                           ShardSpec shard, bool partial_grad) {
  ParameterSpec spec{std::move(name), std::move(shape), init,    weight_decay,
                     total_,          std::move(shard), Shape(), partial_grad};
  spec.layer = adding_layer_;
  const std::string_view n = spec.name;
  spec.read_as_f32 = spec.shape.rank() == 1 || n.ends_with("wte.weight") ||
                     n.ends_with("embed_tokens.weight") || n.ends_with("wpe.weight") ||
                     n.ends_with("embed_positions.weight");
  spec.local_shape = spec.shard.local_shape(spec.shape);
  // Keep every parameter 16-element aligned so views start on 64-byte boundaries.
  total_ += (spec.local_shape.numel() + 15) / 16 * 16;
  specs_.push_back(std::move(spec));
  return int(specs_.size()) - 1;
}

int64_t ParameterRegistry::global_elements() const {
  int64_t total = 0;
  for (const ParameterSpec& spec : specs_) total += spec.tied_copy ? 0 : spec.shape.numel();
  return total;
}

int ParameterRegistry::find(std::string_view name) const {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == name) return int(i);
  }
  return -1;
}

FlatRange ParameterRegistry::padded_range(int index) const {
  const size_t i = size_t(index);
  const int64_t end = i + 1 < specs_.size() ? specs_[i + 1].offset : total_;
  return FlatRange{specs_.at(i).offset, end};
}

std::vector<FlatRange> ParameterRegistry::padded_ranges() const {
  std::vector<FlatRange> ranges;
  for (int i = 0; i < int(specs_.size()); ++i) ranges.push_back(padded_range(i));
  return ranges;
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

ParameterStore::ParameterStore(const ParameterRegistry& registry, Arena& arena, DType compute_dtype,
                               ZeroSharding zero)
    : registry_(registry), zero_(zero), compute_dtype_(compute_dtype) {
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16) {
    LATTICE_THROW(DTypeError, "compute dtype {} is not supported ---> HINT: use f32 or bf16",
                  dtype_name(compute_dtype));
  }
  const int64_t P = registry.total_elements();
  const FlatRange owned = zero.owned(P);
  const bool master_sharded =
      zero.shards_parameters() || (zero.shards_optimizer() && compute_dtype != DType::kF32);
  master_range_ = master_sharded ? owned : FlatRange{0, P};
  grad_range_ = zero.shards_gradients() ? owned : FlatRange{0, P};
  master_ = Tensor::zeros(arena, {master_range_.size()}, DType::kF32, MemoryCategory::kParameters);
  grads_ = Tensor::zeros(arena, {grad_range_.size()}, DType::kF32, MemoryCategory::kGradients);
  if (!zero.shards_parameters()) {
    compute_ = compute_dtype == DType::kF32
                   ? master_
                   : Tensor::zeros(arena, {P}, compute_dtype, MemoryCategory::kParameters);
  }
  const size_t n = registry.specs().size();
  if (zero.shards_gradients()) lent_grads_.resize(n);
  if (zero.shards_parameters()) {
    lent_master_.resize(n);
    lent_compute_.resize(n);
  }
  if (replicated_values()) {
    // The f32 copies, packed (16-element aligned like the flat store), bound for good.
    int64_t elements = 0;
    for (const ParameterSpec& spec : registry.specs()) {
      if (spec.read_as_f32) elements += (spec.local_shape.numel() + 15) / 16 * 16;
    }
    f32_copies_ = Tensor::zeros(arena, {elements}, DType::kF32, MemoryCategory::kParameters);
    lent_master_.resize(n);
    int64_t at = 0;
    for (int i = 0; i < int(n); ++i) {
      const ParameterSpec& spec = registry.at(i);
      if (!spec.read_as_f32) continue;
      lent_master_[size_t(i)] =
          f32_copies_.slice_rows(at, at + spec.local_shape.numel()).view(spec.local_shape);
      at += (spec.local_shape.numel() + 15) / 16 * 16;
    }
  }
}

void ParameterStore::set_replicated_values(int index, const Tensor& values) {
  LATTICE_CHECK(replicated_values(), "set_replicated_values: the master is not sharded");
  const ParameterSpec& spec = registry_.at(index);
  expect_shape(values, spec.local_shape, "ParameterStore::set_replicated_values", "values");
  slice(compute_, index).copy_from(values);  // rounds to the compute dtype
  if (spec.read_as_f32) lent_master_[size_t(index)].copy_from(values);
}

void ParameterStore::assign(int index, const Tensor& values) {
  const ParameterSpec& spec = registry_.at(index);
  expect_shape(values, spec.local_shape, "ParameterStore::assign", "values");
  if (!master_sharded()) {
    slice(master_, index).copy_from(values);
    return;
  }
  const int64_t begin = std::max(spec.offset, master_range_.begin);
  const int64_t end = std::min(spec.offset + spec.local_shape.numel(), master_range_.end);
  if (begin < end) {
    const Tensor flat = values.view(Shape{values.numel()});
    master_.slice_rows(begin - master_range_.begin, end - master_range_.begin)
        .copy_from(flat.slice_rows(begin - spec.offset, end - spec.offset));
  }
  if (replicated_values()) set_replicated_values(index, values);
}

void ParameterStore::initialize(const ModelConfig& config, uint64_t seed) {
  // Each local element draws from its global index: a shard holds the global tensor's values,
  // and a ZeRO-3 rank fills just the elements of its range.
  master_.zero_();  // padding stays zero
  float* master = master_.data<float>();
  const FlatRange held = master_range_;
  for (const ParameterSpec& spec : registry_.specs()) {
    for_each_shard_run(spec.shape, spec.shard, [&](int64_t global, int64_t local, int64_t count) {
      const int64_t begin = std::max(spec.offset + local, held.begin);
      const int64_t end = std::min(spec.offset + local + count, held.end);
      if (begin >= end) return;
      initial_values(spec, config, seed, global + (begin - spec.offset - local), end - begin,
                     master + (begin - held.begin));
    });
  }
  if (replicated_values()) {
    // Every rank's compute copy and f32 copies hold the whole model from the start.
    std::vector<float> values;
    for (int i = 0; i < int(registry_.specs().size()); ++i) {
      const ParameterSpec& spec = registry_.at(i);
      values.assign(size_t(spec.local_shape.numel()), 0.0f);
      for_each_shard_run(spec.shape, spec.shard, [&](int64_t global, int64_t local, int64_t count) {
        initial_values(spec, config, seed, global, count, values.data() + local);
      });
      set_replicated_values(i, Tensor::borrow(values.data(), spec.local_shape, DType::kF32));
    }
    return;
  }
  refresh_compute_copy();
}

void ParameterStore::refresh_compute_copy() {
  if (!compute_.defined() || compute_.dtype() == DType::kF32) return;
  // A sharded master refreshes its own range; the other ranks' come with the gather.
  compute_.slice_rows(master_range_.begin, master_range_.end).copy_from(master_);
}

Tensor ParameterStore::slice(const Tensor& flat, int index) const {
  const ParameterSpec& spec = registry_.at(index);
  return flat.slice_rows(spec.offset, spec.offset + spec.local_shape.numel())
      .view(spec.local_shape);
}

const Tensor& ParameterStore::bound(const std::vector<Tensor>& views, int index,
                                    const char* what) const {
  const Tensor& view = views.at(size_t(index));
  LATTICE_CHECK(view.defined(),
                "the {} of parameter '{}' is used while not held on this rank (ZeRO-{}: it is "
                "lent only between its gather and its release)",
                what, registry_.at(index).name, zero_.stage);
  return view;
}

Tensor ParameterStore::master(int index) const {
  return master_sharded() ? bound(lent_master_, index, "master value") : slice(master_, index);
}
Tensor ParameterStore::grad(int index) const {
  return gradients_lent() ? bound(lent_grads_, index, "gradient") : slice(grads_, index);
}
Tensor ParameterStore::compute(int index) const {
  return values_lent() ? bound(lent_compute_, index, "compute copy") : slice(compute_, index);
}

void ParameterStore::bind_grad(int index, Tensor view) {
  LATTICE_CHECK(gradients_lent(), "bind_grad without ZeRO-2/3 gradient sharding");
  expect_shape(view, registry_.at(index).local_shape, "ParameterStore::bind_grad", "gradient");
  lent_grads_.at(size_t(index)) = std::move(view);
}
void ParameterStore::unbind_grad(int index) {
  lent_grads_.at(size_t(index)) = Tensor();
}

void ParameterStore::bind_values(int index, Tensor master, Tensor compute) {
  LATTICE_CHECK(values_lent(), "bind_values without ZeRO-3 parameter sharding");
  const Shape& shape = registry_.at(index).local_shape;
  expect_shape(master, shape, "ParameterStore::bind_values", "master");
  expect_shape(compute, shape, "ParameterStore::bind_values", "compute");
  lent_master_.at(size_t(index)) = std::move(master);
  lent_compute_.at(size_t(index)) = std::move(compute);
}
void ParameterStore::unbind_values(int index) {
  lent_master_.at(size_t(index)) = Tensor();
  lent_compute_.at(size_t(index)) = Tensor();
}

}  // namespace lattice
