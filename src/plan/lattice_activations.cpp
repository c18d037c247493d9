#include "plan/lattice_activations.h"

namespace lattice::plan {

LatticeActivationBytes lattice_activation_bytes(const ModelSpec& model,
                                                const ActivationOptions& o) {
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

  LatticeActivationBytes bytes;
  double layer = norm;                                    // ln_1
  if (model.fused_qkv) layer += N * (Q + 2.0 * K) * cdt;  // c_attn output
  layer += N * (Q + 2.0 * K) * cdt;                       // q, k, v
  layer += N * Q * cdt + N * QH * f32;                    // attention output, log-sum-exp
  layer += R * C * f32;                                   // mid-point of the residual
  layer += norm;                                          // ln_2
  layer += (swiglu ? 3.0 : 2.0) * N * H * cdt;            // up (+ gate), activation
  bytes.stored = double(model.n_layers) * layer + double(model.n_layers + 1) * R * C * f32;

  double scratch = N * C * f32 + (sp ? R * C * f32 : 0.0);          // row-parallel output (+ shard)
  scratch += R * C * f32 + N * C * f32 + (sp ? R * C * f32 : 0.0);  // dresidual, dln (+ shard)
  if (!f32_compute) scratch += R * C * cdt;                         // dy in the compute dtype
  if (sp) scratch += N * C * cdt + N * C * f32;                     // gathered dy and dresidual
  scratch += N * Q * cdt + N * (Q + 2.0 * K) * cdt;                 // datt, dq, dk, dv
  if (rope) scratch += N * (Q + K) * cdt;                           // dq, dk before RoPE
  if (model.fused_qkv) scratch += N * (Q + 2.0 * K) * cdt;          // dqkv
  scratch += (swiglu ? 3.0 : 2.0) * N * H * cdt;                    // dact, dup (+ dgate)
  bytes.backward_scratch = scratch;

  bytes.output = norm + N * W * f32 + N * f32;    // ln_f, logits, token losses
  if (o.tp > 1) bytes.output += 3.0 * N * f32;    // vocab-parallel CE: row max, two row sums
  if (!f32_compute) bytes.output += N * W * cdt;  // logits' gradient in the compute dtype
  bytes.token_batch = 2.0 * N * 4.0;
  return bytes;
}

}  // namespace lattice::plan
