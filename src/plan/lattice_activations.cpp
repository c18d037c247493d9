#include "plan/lattice_activations.h"

#include <set>

#include "spec/expert_rows.h"

namespace lattice::plan {

LatticeActivationBytes lattice_activation_bytes(const ModelSpec& model, const ActivationOptions& o,
                                                const LatticeStagePart& part,
                                                bool deferred_weights) {
  const double t = double(o.tp);
  const bool sp = o.sequence_parallel && o.tp > 1;
  const double N = double(o.micro_batch * o.seq_len), R = sp ? N / t : N;
  const double C = double(model.d_model), H = double(model.d_ff) / t;
  const double Q = C / t, K = double(model.kv_dim()) / t, QH = double(model.n_heads) / t;
  const double W = double(model.padded_vocab_size) / t;
  const double cdt = o.activation_bytes, f32 = 4.0;
  const bool f32_compute = cdt == f32;
  const bool swiglu = model.mlp == MlpKind::kSwiglu;
  const bool rope = model.position == PositionKind::kRope;
  const double gathered = sp ? N * C * cdt : 0.0;  // an all-gathered copy of R rows under SP
  const double norm = R * C * cdt + 2.0 * R * f32 + gathered;  // output, mean, rstd (+ gathered)
  const double qkv = N * (Q + 2.0 * K) * cdt;
  // Attention reads GPT-2's q, k, v in place in the fused projection output unless RoPE or the
  // ring of context parallelism needs them apart (Transformer::attention_reads_qkv): then they
  // are split copies, with gradients of their own.
  const bool split_qkv = !model.fused_qkv || rope || o.context_parallel;
  const double split = split_qkv ? qkv : 0.0;
  // Sparse layers (model/model_description.h's rows): every expert side is sized for the most
  // rows it may receive, X = ep · M, M the padded packed rows of N·k choices (spec/expert_rows.h).
  const double E = double(model.n_experts);
  const double M =
      model.moe() ? double(max_padded_rows(int64_t(N) * model.experts_per_token, model.n_experts))
                  : 0.0;
  const double X = M * double(o.ep);
  const double hidden_rows = model.moe() ? X : N;
  const double mlp = (swiglu ? 3.0 : 2.0) * hidden_rows * H * cdt;  // up (+ gate), activation
  double experts = 0, experts_scratch = 0;
  if (model.moe()) {
    experts = 2.0 * N * E * f32 + N * f32        // router logits, probabilities, log-sum-exp
              + M * C * cdt + M * C * f32;       // dispatched rows, the experts' outputs
    experts_scratch = M * C * cdt + M * C * f32  // grad experts out, dispatched rows
                      + N * double(model.experts_per_token) * f32         // grad gates
                      + N * E * f32 + (f32_compute ? 0.0 : N * E * cdt);  // grad router logits
    if (o.ep > 1) {  // what arrives from the ep group, apart from this rank's own rows
      experts += X * C * cdt + X * C * f32;
      experts_scratch += X * C * cdt + X * C * f32;
    }
  }

  // One layer's forward buffers: `core` the attention output and its log-sum-exp, `rest` all
  // else (Transformer's Activations::PerLayer).
  const double core = N * Q * cdt + N * QH * f32;
  const double rest = norm + (model.fused_qkv ? qkv : 0.0) + split  // ln_1, c_attn, q k v
                      + R * C * f32                                 // mid-point of the residual
                      + norm + mlp + experts;                       // ln_2, MLP
  const double kept = o.recompute == Recompute::kFull        ? 0.0
                      : o.recompute == Recompute::kSelective ? rest
                                                             : rest + core;

  LatticeActivationBytes bytes;
  // The residual stream at each chunk's layer boundaries (adjacent chunks on one rank share one)
  // and the gradients a chunk receives (all but the head's) and sends (all but the embedding's).
  std::set<int64_t> boundaries;
  double chunk_grads = 0;
  for (const LatticeChunk& chunk : part.chunks) {
    for (int64_t l = chunk.first_layer; l <= chunk.last_layer; ++l) boundaries.insert(l);
    chunk_grads += double(int(!chunk.head) + int(!chunk.embedding)) * R * C * f32;
  }
  const double layers = double(part.layers());
  bytes.slot_layers = double(boundaries.size()) * R * C * f32 + chunk_grads + layers * kept;
  if (deferred_weights) {
    // Output gradients of the MLP down and attention out maps (replicated N×C), the MLP up
    // (+ gate) and the QKV projection, kept from the input pass to the weight pass.
    bytes.slot_layers += layers * (2.0 * N * C * cdt + (mlp - N * H * cdt) + qkv);
  }
  if (part.has_head()) {
    bytes.slot_head = norm + N * W * f32 + N * f32;  // ln_f, logits, token losses
    // Cross-entropy's row statistics for the backward: vocab-parallel row max and two row sums,
    // or one rank's row max and sum.
    bytes.slot_head += (o.tp > 1 ? 3.0 : 2.0) * N * f32;
  }

  double scratch = N * C * f32 + (sp ? R * C * f32 : 0.0);          // row-parallel output (+ shard)
  scratch += R * C * f32 + N * C * f32 + (sp ? R * C * f32 : 0.0);  // dresidual, dln (+ shard)
  if (!f32_compute) scratch += R * C * cdt;                         // dy in the compute dtype
  if (sp) scratch += N * C * cdt + N * C * f32;                     // gathered dy and dresidual
  scratch += N * Q * cdt + split;                                   // datt, dq, dk, dv
  if (rope) scratch += N * (Q + K) * cdt;                           // dq, dk before RoPE
  if (model.fused_qkv) scratch += qkv;                              // dqkv
  scratch += mlp + experts_scratch;                                 // dact, dup (+ dgate)
  if (!f32_compute && part.has_head()) scratch += N * W * cdt;      // logits' gradient
  if (o.recompute != Recompute::kNone) scratch += core;             // the recomputed layer
  if (o.recompute == Recompute::kFull) scratch += rest;
  bytes.scratch = scratch;
  bytes.token_batch = 2.0 * N * 4.0;
  return bytes;
}

}  // namespace lattice::plan
