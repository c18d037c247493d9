#include "plan/activation_memory.h"

namespace lattice::plan {
namespace {

// Every stored tensor of one layer with no recompute, split into the part tensor parallelism
// divides (inside the column/row-parallel region) and the part only sequence parallelism
// divides (norm inputs, block inputs, dropout masks on the residual stream).
struct LayerTensors {
  double tp_split = 0;
  double sp_split = 0;
  double scores = 0;  // a·s² terms (or the flash log-sum-exp), divided by t
};

LayerTensors layer_tensors(const ModelSpec& model, const ActivationOptions& o) {
  const double b = double(o.micro_batch), s = double(o.seq_len), h = double(model.d_model);
  const double a = double(model.n_heads), kv = double(model.kv_dim()), ffn = double(model.d_ff);
  const double act = o.activation_bytes, mask = o.dropout ? 1.0 : 0.0;
  const double sbh = s * b * h;

  LayerTensors t;
  // Residual stream: two norm inputs, the QKV input and the MLP input (the norm outputs), and
  // the dropout masks after attention and after the MLP.
  t.sp_split = 4 * act * sbh + 2 * mask * sbh;
  // Attention: Q, K, V (Q·Kᵀ needs Q and K; probabilities·V needs V), the output projection's
  // input.
  t.tp_split = act * s * b * (h + 2 * kv) + act * sbh;
  // MLP: GELU keeps its input and output (each s·b·ffn); SwiGLU keeps gate, up and product.
  const double mlp = (model.mlp == MlpKind::kSwiglu ? 3 : 2) * act * s * b * ffn;
  if (model.moe()) {
    // Each token through k experts (balanced routing: a rank's experts see as many rows as it
    // sends), their inputs permuted into expert order, and the router's f32 probabilities.
    const double k = double(model.experts_per_token);
    t.tp_split += k * mlp;
    t.sp_split += k * act * sbh + 4.0 * s * b * double(model.n_experts);
  } else {
    t.tp_split += mlp;
  }
  if (o.flash_attention) {
    t.scores = 4.0 * a * s * b;  // f32 log-sum-exp per query row and head
  } else {
    // Probabilities; with dropout also the mask and the dropped-out probabilities.
    t.scores = act * a * s * s * b + (o.dropout ? (1.0 + act) * a * s * s * b : 0.0);
  }
  return t;
}

}  // namespace

double layer_activation_bytes(const ModelSpec& model, const ActivationOptions& o) {
  const double t = double(o.tp);
  const double sp_divisor = o.sequence_parallel ? t : 1.0;
  if (o.recompute == Recompute::kFull) {
    // Only the layer input, sharded along the sequence under SP.
    return o.activation_bytes * double(o.seq_len * o.micro_batch * model.d_model) / sp_divisor;
  }
  LayerTensors parts = layer_tensors(model, o);
  double bytes = parts.sp_split / sp_divisor + parts.tp_split / t;
  // Selective recompute rebuilds the attention core's probabilities in the backward. A
  // flash-style kernel never stores them: its backward needs the log-sum-exp, so it stays.
  if (o.recompute == Recompute::kNone || o.flash_attention) bytes += parts.scores / t;
  return bytes;
}

double recompute_working_bytes(const ModelSpec& model, const ActivationOptions& o) {
  if (o.recompute != Recompute::kFull) return 0.0;
  ActivationOptions full = o;
  full.recompute = Recompute::kNone;
  return layer_activation_bytes(model, full);
}

}  // namespace lattice::plan
