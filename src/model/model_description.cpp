#include "model/model_description.h"

#include <fmt/format.h>

#include "core/error.h"
#include "model/moe_router.h"
#include "model/parameters.h"

namespace lattice {

namespace {

// The sizes Transformer allocates its activations with, derived the same way. Letters of
// kernels/README.md for the global sizes; this rank's: QH/KH query/kv heads (Q/K their widths),
// H hidden features, W padded vocabulary slice, R residual rows (N / tp under sp).
struct RankSizes {
  int tp = 1;
  bool sp = false;
  int64_t B = 0, T = 0, N = 0, R = 0;
  int64_t C = 0, F = 0, H = 0, HS = 0, V = 0, W = 0;
  int64_t NH = 0, NKV = 0, QH = 0, KH = 0, Q = 0, K = 0;
  bool kv_replicated = false;
  int64_t partial_grad_elements = 0;
  ModelPart part;  // never empty here
  DType cdt = DType::kF32;
  // Mixture of experts: E experts, k a token; M packed rows sent, X rows an expert side may get.
  int64_t E = 0, k = 0, M = 0, X = 0;
  bool gpt2 = false, swiglu = false, rope = false;
  // Attention reads q, k, v in place in the fused projection (Transformer::attention_reads_qkv):
  // no q, k, v buffers and no separate gradients of them.
  bool qkv_in_place = false;
};

void check_compute_dtype(DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    LATTICE_THROW(DTypeError, "compute dtype {} is not supported ---> HINT: use f32 or bf16",
                  dtype_name(dtype));
  }
}

RankSizes rank_sizes(const RankWorkload& w) {
  check_compute_dtype(w.compute_dtype);
  const ParameterRegistry registry(w.model, w.tp, w.part, w.ep);  // validates; specs only
  const ModelConfig& c = w.model;
  RankSizes s;
  s.tp = w.tp.size;
  s.sp = w.tp.sequence_parallel && s.tp > 1;
  s.B = w.micro_batch;
  s.T = w.seq_len > 0 ? w.seq_len : c.seq_len;
  if (s.B < 1) {
    LATTICE_THROW(ConfigError, "micro-batch size {} ---> HINT: give batch.micro_batch >= 1", s.B);
  }
  if (s.T > c.seq_len) {
    LATTICE_THROW(ConfigError,
                  "sequence length {} exceeds the model's seq_len {} ---> HINT: lower the batch's "
                  "T or raise model.seq_len",
                  s.T, c.seq_len);
  }
  s.N = s.B * s.T;
  if (c.moe()) {
    s.E = c.n_experts;
    s.k = c.experts_per_token;
    s.M = max_padded_rows(s.N * s.k, s.E);
    s.X = s.M * w.ep.size;
  }
  if (s.sp && s.N % s.tp != 0) {
    LATTICE_THROW(ConfigError,
                  "sequence parallelism splits the {}·{} = {} token rows of a micro-batch over "
                  "--tp {}, which does not divide them ---> HINT: choose a micro-batch size or "
                  "sequence length whose product divides by {}",
                  s.B, s.T, s.N, s.tp, s.tp);
  }
  s.R = s.sp ? s.N / s.tp : s.N;
  s.C = c.d_model;
  s.F = c.d_ff;
  s.H = c.d_ff / s.tp;
  s.HS = c.head_size();
  s.V = c.vocab_size;
  // The padded vocabulary slice of the token table and output head (padded_split_shard).
  s.W = s.tp == 1 ? s.V : (s.V + s.tp - 1) / s.tp;
  s.NH = c.n_head;
  s.NKV = c.n_kv_head;
  s.QH = registry.heads().q_heads;
  s.KH = registry.heads().kv_heads;
  s.Q = s.QH * s.HS;
  s.K = s.KH * s.HS;
  s.kv_replicated = registry.heads().kv_replicated;
  for (const ParameterSpec& spec : registry.specs())
    s.partial_grad_elements += spec.partial_grad ? spec.local_shape.numel() : 0;
  s.part = registry.part();
  s.cdt = w.compute_dtype;
  s.gpt2 = c.family == ModelFamily::kGpt2;
  s.swiglu = c.mlp == MlpKind::kSwiglu;
  s.rope = c.position == PositionKind::kRope;
  s.qkv_in_place = s.gpt2 && !s.rope && !w.context_parallel;
  return s;
}

}  // namespace

ParameterTable parameter_table(const RankWorkload& w, int64_t optimizer_elements) {
  check_compute_dtype(w.compute_dtype);
  const ParameterRegistry registry(w.model, w.tp, w.part, w.ep);
  const bool mixed = w.compute_dtype != DType::kF32;
  // Bytes per element of a parameter: the f32 master, plus the rounded compute copy under bf16
  // (with f32 compute the master is the compute copy).
  const int64_t per_element =
      int64_t(dtype_size(DType::kF32)) + (mixed ? int64_t(dtype_size(w.compute_dtype)) : 0);
  ParameterTable table;
  for (const ParameterSpec& spec : registry.specs()) {
    ParameterRow row;
    row.name = spec.name;
    row.global_shape = spec.shape;
    row.local_shape = spec.local_shape;
    row.shard = spec.shard.describe();
    if (spec.partial_grad) row.shard += "; partial grad: summed over tp";
    if (spec.tied_copy) row.shard += "; tied copy: grad summed over the embedding group";
    row.dtype = mixed ? fmt::format("f32 master + {} compute", dtype_name(w.compute_dtype)) : "f32";
    row.bytes = spec.local_shape.numel() * per_element;
    table.local_elements += spec.local_shape.numel();
    if (spec.partial_grad) table.partial_grad_elements += spec.local_shape.numel();
    table.rows.push_back(std::move(row));
  }
  table.global_elements = registry.global_elements();
  table.store_elements = registry.total_elements();
  table.parameter_bytes = table.store_elements * per_element;
  // Transformer packs the partial gradients into one extra f32 buffer for their single all-reduce.
  table.gradient_bytes =
      (table.store_elements + table.partial_grad_elements) * int64_t(sizeof(float));
  table.optimizer_elements = optimizer_elements < 0 ? table.store_elements : optimizer_elements;
  table.optimizer_bytes = 2 * table.optimizer_elements * int64_t(sizeof(float));  // m and v
  return table;
}

ParameterTable parameter_table(const RankWorkload& w, const ZeroSharding& zero) {
  ParameterTable table = parameter_table(w, -1);
  const ParameterRegistry registry(w.model, w.tp, w.part, w.ep);
  const bool mixed = w.compute_dtype != DType::kF32;
  const int64_t P = table.store_elements;
  const FlatRange owned = zero.owned(P);
  const bool master_sharded = zero.shards_parameters() || (zero.shards_optimizer() && mixed);
  int64_t read_as_f32 = 0;  // the f32 copies of a sharded master with a resident compute copy
  for (const ParameterSpec& spec : registry.specs()) {
    if (spec.read_as_f32) read_as_f32 += (spec.local_shape.numel() + 15) / 16 * 16;
  }
  const int64_t f32 = int64_t(sizeof(float));
  table.parameter_bytes = f32 * (master_sharded ? owned.size() : P);
  if (!zero.shards_parameters()) {
    if (mixed) table.parameter_bytes += int64_t(dtype_size(w.compute_dtype)) * P;
    if (master_sharded) table.parameter_bytes += f32 * read_as_f32;
  }
  table.gradient_bytes =
      f32 * ((zero.shards_gradients() ? owned.size() : P) + table.partial_grad_elements);
  table.optimizer_elements = owned.size();
  table.optimizer_bytes = 2 * f32 * owned.size();
  return table;
}

ActivationTable activation_table(const RankWorkload& w) {
  const RankSizes s = rank_sizes(w);
  if (w.deferred_weights && w.recompute != Recompute::kNone) {
    LATTICE_THROW(ConfigError,
                  "deferred weight gradients (zero-bubble schedules) keep the activations for the "
                  "weight pass; recompute '{}' frees them ---> HINT: use recompute none with zb-h1",
                  recompute_name(w.recompute));
  }
  const DType f32 = DType::kF32, cdt = s.cdt;
  ActivationTable table;
  // Split labels; with tp = 1 nothing is split and every buffer is whole ("replicated").
  const std::string rows = s.sp ? "token rows (sp)" : "replicated";
  const std::string heads = s.tp > 1 ? "heads" : "replicated";
  const std::string kv_heads = s.tp == 1 || (s.kv_replicated && s.KH == s.NKV) ? "replicated"
                               : s.kv_replicated ? "heads (kv head shared)"
                                                 : "heads";
  const std::string hidden = s.tp > 1 ? "hidden (d_ff)" : "replicated";
  const std::string vocab = s.tp > 1 ? "vocab" : "replicated";
  const std::string partial = s.tp > 1 ? "partial sums" : "replicated";
  int64_t* counter = &table.slot_bytes;
  auto add = [&](std::string name, Shape global, Shape local, std::string split, DType dtype) {
    const int64_t bytes = local.numel() * int64_t(dtype_size(dtype));
    *counter += bytes;
    table.total_bytes += bytes;
    table.rows.push_back(
        {std::move(name), std::move(global), std::move(local), std::move(split), dtype, bytes});
  };
  // A buffer of the residual stream's rows: (R, X) of (N, X).
  auto add_rows = [&](std::string name, int64_t width, DType dtype) {
    add(std::move(name), width > 0 ? Shape{s.N, width} : Shape{s.N},
        width > 0 ? Shape{s.R, width} : Shape{s.R}, rows, dtype);
  };
  // Under sequence parallelism a gathered (N, C) copy of a row-split buffer; otherwise an alias.
  auto add_gathered = [&](std::string name, DType dtype) {
    if (s.sp) add(std::move(name) + " (gathered)", {s.N, s.C}, {s.N, s.C}, "replicated", dtype);
  };
  const Shape q_global{s.B, s.T, s.NH, s.HS}, q_local{s.B, s.T, s.QH, s.HS};
  const Shape kv_global{s.B, s.T, s.NKV, s.HS}, kv_local{s.B, s.T, s.KH, s.HS};
  const int64_t L = w.model.n_layer;

  // The micro-batch's slot: what forward() writes and backward() reads. Per chunk: the residual
  // stream at its layers' boundaries, and the gradients a pipeline stage receives and sends.
  std::vector<bool> residual_held(size_t(L + 1), false);
  for (size_t chunk = 0; chunk < s.part.chunks.size(); ++chunk) {
    const LayerChunk& k = s.part.chunks[chunk];
    for (int64_t l = k.first_layer; l <= k.last_layer; ++l) {
      // Two adjacent chunks on one rank share a boundary: the later buffer replaces the former.
      if (!residual_held[size_t(l)]) add_rows(fmt::format("residual {}", l), s.C, f32);
      residual_held[size_t(l)] = true;
    }
    if (!k.head) add_rows(fmt::format("chunk {} output grad (received)", chunk), s.C, f32);
    if (!k.embedding) add_rows(fmt::format("chunk {} input grad (sent)", chunk), s.C, f32);
  }
  // One layer's forward buffers (Activations::PerLayer): `core` the attention output and its
  // softmax statistics, `rest` everything else.
  auto add_layer = [&](const std::string& p, bool core, bool rest) {
    if (rest) {
      add_rows(p + "ln_1", s.C, cdt);
      add_rows(p + "ln_1 mean", 0, f32);
      add_rows(p + "ln_1 rstd", 0, f32);
      add_gathered(p + "ln_1", cdt);
      if (s.gpt2) {
        add(p + "qkv", {s.N, s.C + 2 * s.NKV * s.HS}, {s.N, s.Q + 2 * s.K}, heads, cdt);
      }
      if (!s.qkv_in_place) {
        add(p + "q", q_global, q_local, heads, cdt);
        add(p + "k", kv_global, kv_local, kv_heads, cdt);
        add(p + "v", kv_global, kv_local, kv_heads, cdt);
      }
    }
    if (core) {
      add(p + "attention", q_global, q_local, heads, cdt);
      add(p + "attention lse", {s.B, s.NH, s.T}, {s.B, s.QH, s.T}, heads, f32);
    }
    if (rest) {
      add_rows(p + "mid residual", s.C, f32);
      add_rows(p + "ln_2", s.C, cdt);
      add_rows(p + "ln_2 mean", 0, f32);
      add_rows(p + "ln_2 rstd", 0, f32);
      add_gathered(p + "ln_2", cdt);
      if (s.E == 0) {
        add(p + "mlp up", {s.N, s.F}, {s.N, s.H}, hidden, cdt);
        if (s.swiglu) add(p + "mlp gate", {s.N, s.F}, {s.N, s.H}, hidden, cdt);
        add(p + "mlp act", {s.N, s.F}, {s.N, s.H}, hidden, cdt);
        return;
      }
      // The experts' rows: at most X received (the padded packed rows of every ep peer).
      add(p + "experts up", {s.X, s.F}, {s.X, s.H}, hidden, cdt);
      if (s.swiglu) add(p + "experts gate", {s.X, s.F}, {s.X, s.H}, hidden, cdt);
      add(p + "experts act", {s.X, s.F}, {s.X, s.H}, hidden, cdt);
      add(p + "router logits", {s.N, s.E}, {s.N, s.E}, "replicated", f32);
      add(p + "router probs", {s.N, s.E}, {s.N, s.E}, "replicated", f32);
      add(p + "router lse", {s.N}, {s.N}, "replicated", f32);
      add(p + "dispatched rows", {s.M, s.C}, {s.M, s.C}, "replicated", cdt);
      add(p + "experts out", {s.M, s.C}, {s.M, s.C}, partial, f32);
      if (s.X != s.M) {
        add(p + "received rows", {s.X, s.C}, {s.X, s.C}, "replicated", cdt);
        add(p + "received rows' out", {s.X, s.C}, {s.X, s.C}, partial, f32);
      }
    }
  };
  // Kept per layer: all (none), all but the attention core (selective), nothing (full).
  for (int64_t l = 0; l < L; ++l) {
    if (!s.part.holds_layer(l)) continue;
    add_layer(fmt::format("layer {} ", l), w.recompute == Recompute::kNone,
              w.recompute != Recompute::kFull);
  }
  // Zero-bubble schedules: the output gradients of each layer's linear maps, kept from its
  // input-gradient pass until its weight-gradient pass.
  for (int64_t l = 0; l < L && w.deferred_weights; ++l) {
    if (!s.part.holds_layer(l)) continue;
    const std::string p = fmt::format("layer {} deferred ", l);
    add(p + "grad mlp out", {s.N, s.C}, {s.N, s.C}, "replicated", cdt);
    add(p + "grad mlp up", {s.N, s.F}, {s.N, s.H}, hidden, cdt);
    if (s.swiglu) add(p + "grad mlp gate", {s.N, s.F}, {s.N, s.H}, hidden, cdt);
    add(p + "grad attn out", {s.N, s.C}, {s.N, s.C}, "replicated", cdt);
    if (s.gpt2) {
      add(p + "grad qkv", {s.N, s.C + 2 * s.NKV * s.HS}, {s.N, s.Q + 2 * s.K}, heads, cdt);
    } else {
      add(p + "grad q", {s.N, s.C}, {s.N, s.Q}, heads, cdt);
      add(p + "grad k", {s.N, s.NKV * s.HS}, {s.N, s.K}, kv_heads, cdt);
      add(p + "grad v", {s.N, s.NKV * s.HS}, {s.N, s.K}, kv_heads, cdt);
    }
  }
  if (s.part.has_head()) {
    add_rows("ln_f", s.C, cdt);
    add_rows("ln_f mean", 0, f32);
    add_rows("ln_f rstd", 0, f32);
    add_gathered("ln_f", cdt);
    add("logits", {s.N, s.V}, {s.N, s.W}, vocab, f32);
    add("losses", {s.N}, {s.N}, "replicated", f32);
    if (s.tp > 1) {  // VocabParallelCrossEntropy's row statistics
      add("loss row max", {s.N}, {s.N}, "replicated", f32);
      add("loss Σexp and target logit", {2, s.N}, {2, s.N}, "replicated", f32);
    } else {  // cross_entropy_forward's row statistics, kept for the backward
      add("loss row max and Σexp", {2, s.N}, {2, s.N}, "replicated", f32);
    }
  }

  // Scratch shared by every micro-batch in flight: one layer's row-parallel output and all of
  // backward's working buffers.
  counter = &table.scratch_bytes;
  add("row-parallel out", {s.N, s.C}, {s.N, s.C}, partial, f32);
  if (s.sp) add_rows("row-parallel out (reduced)", s.C, f32);
  add_rows("grad residual", s.C, f32);
  add("grad ln", {s.N, s.C}, {s.N, s.C}, partial, f32);
  if (s.sp) add_rows("grad ln (reduced)", s.C, f32);
  // The residual gradient as a matmul operand: a compute-dtype copy (bf16), gathered under sp.
  if (cdt != f32) add_rows("grad residual (operand)", s.C, cdt);
  add_gathered("grad residual (operand)", cdt);
  add_gathered("grad residual", f32);
  add("grad attention", q_global, q_local, heads, cdt);
  if (!s.qkv_in_place) {
    add("grad q", q_global, q_local, heads, cdt);
    add("grad k", kv_global, kv_local, kv_heads, cdt);
    add("grad v", kv_global, kv_local, kv_heads, cdt);
  }
  if (s.rope) {
    add("grad q (before rope)", q_global, q_local, heads, cdt);
    add("grad k (before rope)", kv_global, kv_local, kv_heads, cdt);
  }
  if (s.gpt2) add("grad qkv", {s.N, s.C + 2 * s.NKV * s.HS}, {s.N, s.Q + 2 * s.K}, heads, cdt);
  const int64_t hidden_rows = s.E > 0 ? s.X : s.N;
  add("grad mlp act", {hidden_rows, s.F}, {hidden_rows, s.H}, hidden, cdt);
  add("grad mlp up", {hidden_rows, s.F}, {hidden_rows, s.H}, hidden, cdt);
  if (s.swiglu) add("grad mlp gate", {hidden_rows, s.F}, {hidden_rows, s.H}, hidden, cdt);
  if (cdt != f32 && s.part.has_head()) add("grad logits", {s.N, s.V}, {s.N, s.W}, vocab, cdt);
  if (s.E > 0) {
    add("grad experts out", {s.M, s.C}, {s.M, s.C}, "replicated", cdt);
    add("grad dispatched rows", {s.M, s.C}, {s.M, s.C}, partial, f32);
    add("grad gates", {s.N * s.k}, {s.N * s.k}, partial, f32);
    add("grad router logits", {s.N, s.E}, {s.N, s.E}, "replicated", f32);
    if (cdt != f32) add("grad router logits (operand)", {s.N, s.E}, {s.N, s.E}, "replicated", cdt);
    if (s.X != s.M) {
      add("grad received rows' out", {s.X, s.C}, {s.X, s.C}, "replicated", cdt);
      add("grad received rows", {s.X, s.C}, {s.X, s.C}, partial, f32);
    }
  }
  // Recompute: one layer's forward buffers shared by every layer and micro-batch.
  if (w.recompute != Recompute::kNone) {
    add_layer("recomputed ", true, w.recompute == Recompute::kFull);
  }
  return table;
}

std::vector<CollectiveRecord> tensor_parallel_collectives(const RankWorkload& w) {
  const RankSizes s = rank_sizes(w);
  const DType f32 = DType::kF32;
  const int64_t NC = s.N * s.C;  // every stream collective moves a full (N, C) buffer
  std::vector<CollectiveRecord> out;
  auto rec = [&](std::string op, std::string what, int64_t elements, DType dtype) {
    out.push_back({std::move(op), std::move(what), elements, dtype});
  };
  // After a row-parallel map (and the embedding): reduce-scatter under sp, all-reduce otherwise.
  auto reduce_rows = [&](std::string what) {
    rec(s.sp ? "reduce_scatter" : "all_reduce", std::move(what), NC, f32);
  };
  // Before a column-parallel map under sp: gather the normalised rows (compute dtype).
  auto gather_rows = [&](std::string what, DType dtype) {
    if (s.sp) rec("all_gather", std::move(what), NC, dtype);
  };

  auto layer_forward = [&](int64_t l) {
    gather_rows(fmt::format("layer {} ln_1 (fwd)", l), s.cdt);
    reduce_rows(fmt::format("layer {} attn out (fwd)", l));
    gather_rows(fmt::format("layer {} ln_2 (fwd)", l), s.cdt);
    reduce_rows(fmt::format("layer {} mlp out (fwd)", l));
  };

  // Forward of each chunk, in local order.
  for (const LayerChunk& k : s.part.chunks) {
    if (k.embedding) reduce_rows("embedding (fwd)");
    for (int64_t l = k.first_layer; l < k.last_layer; ++l) layer_forward(l);
    if (!k.head) continue;
    gather_rows("ln_f (fwd)", s.cdt);
    if (s.tp > 1) {  // vocab-parallel cross-entropy: row statistics, never the logits
      rec("all_reduce_max", "logits row max", s.N, f32);
      rec("all_reduce", "logits Σexp and target logit", 2 * s.N, f32);
    }
  }

  // Backward of each chunk, in reverse local order: the conjugates, in reverse. A norm's input
  // gradient is a partial sum (f32); the residual gradient is gathered (compute dtype) before a
  // row-parallel map's backward.
  for (auto k = s.part.chunks.rbegin(); k != s.part.chunks.rend(); ++k) {
    if (k->head) reduce_rows("ln_f (bwd)");
    for (int64_t l = k->last_layer - 1; l >= k->first_layer; --l) {
      if (w.recompute == Recompute::kFull) layer_forward(l);  // the same collectives again
      gather_rows(fmt::format("layer {} mlp out (bwd)", l), s.cdt);
      reduce_rows(fmt::format("layer {} ln_2 (bwd)", l));
      gather_rows(fmt::format("layer {} attn out (bwd)", l), s.cdt);
      reduce_rows(fmt::format("layer {} ln_1 (bwd)", l));
    }
    if (k->embedding) gather_rows("embedding (bwd)", f32);
  }

  // Once per step: the gradients of replicated parameters that each rank computed in part.
  if (s.tp > 1 && s.partial_grad_elements > 0) {
    rec("all_reduce", "replicated parameters' gradients", s.partial_grad_elements, f32);
  }
  return out;
}

int64_t collective_bytes(const CollectiveRecord& record) {
  return record.elements * int64_t(dtype_size(record.dtype));
}

}  // namespace lattice
