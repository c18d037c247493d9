#include "model/transformer.h"

#include "kernels/activations.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/normalization.h"
#include "kernels/rope.h"

namespace lattice {

namespace {

// A linear map's parameters. GPT-2's Conv1D stores the weight [in, out] (y = x·W); Llama's
// Linear stores it [out, in] (y = x·Wᵀ).
struct Linear {
  int weight = -1;
  int bias = -1;
  bool in_out = false;
};

struct Norm {
  int weight = -1;
  int bias = -1;
};

Linear find_linear(const ParameterRegistry& r, const std::string& prefix, bool in_out) {
  Linear l{r.find(prefix + ".weight"), r.find(prefix + ".bias"), in_out};
  LATTICE_CHECK(l.weight >= 0, "missing parameter {}.weight", prefix);
  return l;
}

Norm find_norm(const ParameterRegistry& r, const std::string& prefix) {
  Norm n{r.find(prefix + ".weight"), r.find(prefix + ".bias")};
  LATTICE_CHECK(n.weight >= 0, "missing parameter {}.weight", prefix);
  return n;
}

// y (N, out) = x (N, in) · W + b
void linear_forward(const ParameterStore& s, const Linear& l, Tensor& y, const Tensor& x) {
  Tensor bias = l.bias >= 0 ? s.master(l.bias) : Tensor();
  matmul(y, x, s.compute(l.weight), bias, {.transpose_b = !l.in_out});
}

// dx (=, or += with accumulate_dx) dy · Wᵀ; dW += xᵀ·dy (or dyᵀ·x); db += Σ rows of dy.
void linear_backward(const ParameterStore& s, const Linear& l, Tensor& dx, bool accumulate_dx,
                     const Tensor& dy, const Tensor& x) {
  matmul(dx, dy, s.compute(l.weight), Tensor(),
         {.transpose_b = l.in_out, .accumulate = accumulate_dx});
  Tensor dw = s.grad(l.weight);
  if (l.in_out) {
    matmul(dw, x, dy, Tensor(), {.transpose_a = true, .accumulate = true});
  } else {
    matmul(dw, dy, x, Tensor(), {.transpose_a = true, .accumulate = true});
  }
  if (l.bias >= 0) {
    Tensor db = s.grad(l.bias);
    bias_backward(db, dy);
  }
}

}  // namespace

struct Transformer::Layer {
  Norm norm1, norm2;
  std::vector<Linear> qkv;  // GPT-2: one fused c_attn; Llama: q_proj, k_proj, v_proj
  Linear out;               // attention output projection
  Linear up;                // GELU: c_fc; SwiGLU: the "up" branch
  Linear gate;              // SwiGLU only
  Linear down;              // MLP output projection
};

// One micro-batch's activations (forward) and gradient scratch (backward). Shapes use the
// letters of kernels/README.md; cdt is the compute dtype.
struct Transformer::Activations {
  int64_t B = 0, T = 0, N = 0;
  Tensor tokens, targets;  // the caller's (B, T) i32

  struct PerLayer {
    Tensor ln1, ln1_mean, ln1_rstd;  // (N, C) cdt; (N) f32
    Tensor qkv;                      // (N, C + 2·KV) cdt, GPT-2 only
    Tensor q, k, v;                  // (B, T, NH|NKV, HS) cdt, after rotary positions
    Tensor att, lse;                 // (B, T, NH, HS) cdt; (B, NH, T) f32
    Tensor mid;                      // (N, C) f32: residual after attention
    Tensor ln2, ln2_mean, ln2_rstd;
    Tensor up, gate, act;  // (N, F) cdt: pre-activation(s) and the activation
  };
  std::vector<Tensor> residual;  // L + 1 tensors (N, C) f32: input of layer l; final output
  std::vector<PerLayer> layer;
  Tensor lnf, lnf_mean, lnf_rstd;
  Tensor logits, losses;  // (N, V) f32; (N) f32
  Tensor proj;            // (N, C) f32 scratch: output of a projection into the residual stream

  // Backward scratch.
  Tensor dresidual;         // (N, C) f32
  Tensor dln;               // (N, C) f32: gradient of a norm's output
  Tensor dy;                // (N, C) cdt: dresidual as a matmul operand (alias when f32)
  Tensor datt;              // (B, T, NH, HS) cdt
  Tensor dq, dk, dv;        // gradients of q, k, v after rotary
  Tensor dq_in, dk_in;      // before rotary (RoPE only)
  Tensor dqkv;              // GPT-2 only
  Tensor dact, dup, dgate;  // (N, F) cdt
  Tensor dlogits;           // (N, V) cdt (bf16 only; f32 reuses logits)
};

Transformer::Transformer(ModelConfig config, Arena& arena, DType compute_dtype)
    : config_(std::move(config)),
      arena_(arena),
      compute_dtype_(compute_dtype),
      registry_(config_),
      store_(registry_, arena, compute_dtype) {
  const ParameterRegistry& r = registry_;
  const bool gpt2 = config_.family == ModelFamily::kGpt2;
  wte_ = r.find(gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight");
  wpe_ = r.find(gpt2 ? "transformer.wpe.weight" : "model.embed_positions.weight");
  Norm lnf = find_norm(r, gpt2 ? "transformer.ln_f" : "model.norm");
  lnf_w_ = lnf.weight;
  lnf_b_ = lnf.bias;
  lm_head_ = config_.tied_embeddings ? wte_ : r.find("lm_head.weight");
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    Layer layer;
    if (gpt2) {
      std::string h = fmt::format("transformer.h.{}.", l);
      layer.norm1 = find_norm(r, h + "ln_1");
      layer.qkv = {find_linear(r, h + "attn.c_attn", true)};
      layer.out = find_linear(r, h + "attn.c_proj", true);
      layer.norm2 = find_norm(r, h + "ln_2");
      if (config_.mlp == MlpKind::kGelu) {
        layer.up = find_linear(r, h + "mlp.c_fc", true);
      } else {
        layer.gate = find_linear(r, h + "mlp.c_fc", true);
        layer.up = find_linear(r, h + "mlp.c_fc2", true);
      }
      layer.down = find_linear(r, h + "mlp.c_proj", true);
    } else {
      std::string h = fmt::format("model.layers.{}.", l);
      layer.norm1 = find_norm(r, h + "input_layernorm");
      layer.qkv = {find_linear(r, h + "self_attn.q_proj", false),
                   find_linear(r, h + "self_attn.k_proj", false),
                   find_linear(r, h + "self_attn.v_proj", false)};
      layer.out = find_linear(r, h + "self_attn.o_proj", false);
      layer.norm2 = find_norm(r, h + "post_attention_layernorm");
      if (config_.mlp == MlpKind::kSwiglu) layer.gate = find_linear(r, h + "mlp.gate_proj", false);
      layer.up = find_linear(r, h + "mlp.up_proj", false);
      layer.down = find_linear(r, h + "mlp.down_proj", false);
    }
    layers_.push_back(layer);
  }
}

Transformer::~Transformer() = default;

void Transformer::ensure_activations(int64_t B, int64_t T) {
  if (acts_ && acts_->B == B && acts_->T == T) return;
  acts_.reset();  // return the old buffers to the arena before allocating new ones
  auto a = std::make_unique<Activations>();
  const ModelConfig& c = config_;
  const int64_t N = B * T, C = c.d_model, F = c.d_ff, V = c.vocab_size, KV = c.kv_width();
  const int64_t NH = c.n_head, NKV = c.n_kv_head, HS = c.head_size();
  const DType cdt = compute_dtype_;
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const bool swiglu = c.mlp == MlpKind::kSwiglu;
  const bool rope = c.position == PositionKind::kRope;
  auto alloc = [&](Shape shape, DType dtype) {
    return Tensor::empty(arena_, std::move(shape), dtype, MemoryCategory::kActivations);
  };
  a->B = B;
  a->T = T;
  a->N = N;
  for (int64_t l = 0; l <= c.n_layer; ++l) a->residual.push_back(alloc({N, C}, DType::kF32));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    Activations::PerLayer p;
    p.ln1 = alloc({N, C}, cdt);
    p.ln1_mean = alloc({N}, DType::kF32);
    p.ln1_rstd = alloc({N}, DType::kF32);
    if (gpt2) p.qkv = alloc({N, C + 2 * KV}, cdt);
    p.q = alloc({B, T, NH, HS}, cdt);
    p.k = alloc({B, T, NKV, HS}, cdt);
    p.v = alloc({B, T, NKV, HS}, cdt);
    p.att = alloc({B, T, NH, HS}, cdt);
    p.lse = alloc({B, NH, T}, DType::kF32);
    p.mid = alloc({N, C}, DType::kF32);
    p.ln2 = alloc({N, C}, cdt);
    p.ln2_mean = alloc({N}, DType::kF32);
    p.ln2_rstd = alloc({N}, DType::kF32);
    p.up = alloc({N, F}, cdt);
    if (swiglu) p.gate = alloc({N, F}, cdt);
    p.act = alloc({N, F}, cdt);
    a->layer.push_back(std::move(p));
  }
  a->lnf = alloc({N, C}, cdt);
  a->lnf_mean = alloc({N}, DType::kF32);
  a->lnf_rstd = alloc({N}, DType::kF32);
  a->logits = alloc({N, V}, DType::kF32);
  a->losses = alloc({N}, DType::kF32);
  a->proj = alloc({N, C}, DType::kF32);

  a->dresidual = alloc({N, C}, DType::kF32);
  a->dln = alloc({N, C}, DType::kF32);
  a->dy = cdt == DType::kF32 ? a->dresidual : alloc({N, C}, cdt);
  a->datt = alloc({B, T, NH, HS}, cdt);
  a->dq = alloc({B, T, NH, HS}, cdt);
  a->dk = alloc({B, T, NKV, HS}, cdt);
  a->dv = alloc({B, T, NKV, HS}, cdt);
  if (rope) {
    a->dq_in = alloc({B, T, NH, HS}, cdt);
    a->dk_in = alloc({B, T, NKV, HS}, cdt);
  }
  if (gpt2) a->dqkv = alloc({N, C + 2 * KV}, cdt);
  a->dact = alloc({N, F}, cdt);
  a->dup = alloc({N, F}, cdt);
  if (swiglu) a->dgate = alloc({N, F}, cdt);
  if (cdt != DType::kF32) a->dlogits = alloc({N, V}, cdt);
  acts_ = std::move(a);
}

namespace {

void norm_forward(const ModelConfig& c, const ParameterStore& s, const Norm& n, Tensor& out,
                  Tensor& mean, Tensor& rstd, const Tensor& inp) {
  if (c.norm == NormKind::kLayerNorm) {
    Tensor bias = n.bias >= 0 ? s.master(n.bias) : Tensor();
    layernorm_forward(out, mean, rstd, inp, s.master(n.weight), bias, c.norm_eps);
  } else {
    rmsnorm_forward(out, rstd, inp, s.master(n.weight), c.norm_eps);
  }
}

void norm_backward(const ModelConfig& c, const ParameterStore& s, const Norm& n, Tensor& dinp,
                   const Tensor& dout, const Tensor& inp, const Tensor& mean, const Tensor& rstd) {
  Tensor dweight = s.grad(n.weight);
  if (c.norm == NormKind::kLayerNorm) {
    Tensor dbias = n.bias >= 0 ? s.grad(n.bias) : Tensor();
    layernorm_backward(dinp, dweight, dbias, dout, inp, s.master(n.weight), mean, rstd);
  } else {
    rmsnorm_backward(dinp, dweight, dout, inp, s.master(n.weight), rstd);
  }
}

// Copies src into dst unless they are the same tensor (f32 compute: dst aliases src).
void copy_unless_alias(Tensor& dst, const Tensor& src) {
  if (dst.raw_data() != src.raw_data()) dst.copy_from(src);
}

}  // namespace

ForwardResult Transformer::forward(const Tensor& tokens, const Tensor& targets) {
  expect_dtype(tokens, DType::kI32, "Transformer::forward", "tokens");
  expect_rank(tokens, 2, "Transformer::forward", "tokens");
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  if (T > config_.seq_len) {
    LATTICE_THROW(ShapeError,
                  "Transformer::forward: sequence length {} exceeds the model's seq_len {} "
                  "---> HINT: lower the batch's T or raise model.seq_len",
                  T, config_.seq_len);
  }
  if (targets.defined()) {
    expect_dtype(targets, DType::kI32, "Transformer::forward", "targets");
    expect_same_shape(tokens, targets, "Transformer::forward", "tokens", "targets");
  }
  ensure_activations(B, T);
  Activations& a = *acts_;
  const ModelConfig& c = config_;
  const ParameterStore& s = store_;
  const int64_t N = a.N, C = c.d_model, KV = c.kv_width();
  a.tokens = tokens;
  a.targets = targets;
  have_targets_ = targets.defined();

  // Embeddings (f32 master tables) into the residual stream.
  Tensor ids = tokens.view({N});
  embedding_forward(a.residual[0], ids, s.master(wte_));
  if (c.position == PositionKind::kLearned) {
    Tensor x = a.residual[0].view({B, T, C});
    position_embedding_forward(x, s.master(wpe_));
  }

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const Layer& L = layers_[size_t(l)];
    Activations::PerLayer& p = a.layer[size_t(l)];
    // Attention block: mid = x + out_proj(attention(norm1(x))).
    norm_forward(c, s, L.norm1, p.ln1, p.ln1_mean, p.ln1_rstd, a.residual[size_t(l)]);
    Tensor q = p.q.view({N, C}), k = p.k.view({N, KV}), v = p.v.view({N, KV});
    if (L.qkv.size() == 1) {
      linear_forward(s, L.qkv[0], p.qkv, p.ln1);
      split_last_dim({&q, &k, &v}, p.qkv);
    } else {
      linear_forward(s, L.qkv[0], q, p.ln1);
      linear_forward(s, L.qkv[1], k, p.ln1);
      linear_forward(s, L.qkv[2], v, p.ln1);
    }
    if (c.position == PositionKind::kRope) {
      rope_forward(p.q, p.q, c.rope_theta);
      rope_forward(p.k, p.k, c.rope_theta);
    }
    attention_forward(p.att, p.lse, p.q, p.k, p.v);
    linear_forward(s, L.out, a.proj, p.att.view({N, C}));
    add(p.mid, a.residual[size_t(l)], a.proj);

    // MLP block: out = mid + down(act(up(norm2(mid)))).
    norm_forward(c, s, L.norm2, p.ln2, p.ln2_mean, p.ln2_rstd, p.mid);
    linear_forward(s, L.up, p.up, p.ln2);
    if (c.mlp == MlpKind::kGelu) {
      gelu_forward(p.act, p.up);
    } else {
      linear_forward(s, L.gate, p.gate, p.ln2);
      swiglu_forward(p.act, p.gate, p.up);
    }
    linear_forward(s, L.down, a.proj, p.act);
    add(a.residual[size_t(l) + 1], p.mid, a.proj);
  }

  Norm lnf{lnf_w_, lnf_b_};
  norm_forward(c, s, lnf, a.lnf, a.lnf_mean, a.lnf_rstd, a.residual.back());
  // logits (N, V) = lnf · Wᵀ with W (V, C): the tied token table or the separate head.
  matmul(a.logits, a.lnf, s.compute(lm_head_), Tensor(), {.transpose_b = true});

  ForwardResult result;
  if (targets.defined()) {
    result.token_count = cross_entropy_forward(a.losses, a.logits, targets.view({N}));
    const float* losses = a.losses.data<float>();
    for (int64_t i = 0; i < N; ++i) result.loss_sum += double(losses[i]);
  }
  return result;
}

const Tensor& Transformer::logits() const {
  LATTICE_CHECK(acts_ != nullptr, "logits() before any forward()");
  return acts_->logits;
}

void Transformer::report_grads_ready(std::initializer_list<int> params) const {
  if (!grad_ready_hook_) return;
  for (int p : params) {
    if (p >= 0) grad_ready_hook_(p);
  }
}

void Transformer::report_layer_grads_ready(const Layer& L) const {
  report_grads_ready({L.norm1.weight, L.norm1.bias, L.out.weight, L.out.bias, L.norm2.weight,
                      L.norm2.bias, L.up.weight, L.up.bias, L.gate.weight, L.gate.bias,
                      L.down.weight, L.down.bias});
  for (const Linear& q : L.qkv) report_grads_ready({q.weight, q.bias});
}

void Transformer::backward(float loss_scale) {
  LATTICE_CHECK(acts_ != nullptr && have_targets_,
                "backward() needs a forward() with targets first");
  Activations& a = *acts_;
  const ModelConfig& c = config_;
  const ParameterStore& s = store_;
  const int64_t N = a.N, C = c.d_model, KV = c.kv_width();
  const int64_t B = a.B, T = a.T;

  // Loss -> logits, written in place of the logits (they are not needed afterwards).
  cross_entropy_backward(a.logits, a.logits, a.targets.view({N}), loss_scale);
  Tensor dlogits = a.logits;
  if (compute_dtype_ != DType::kF32) {
    a.dlogits.copy_from(a.logits);
    dlogits = a.dlogits;
  }
  // Output head: logits = lnf · Wᵀ, W (V, C).
  matmul(a.dln, dlogits, s.compute(lm_head_), Tensor(), {});
  Tensor dhead = s.grad(lm_head_);
  matmul(dhead, dlogits, a.lnf, Tensor(), {.transpose_a = true, .accumulate = true});
  if (lm_head_ != wte_) report_grads_ready({lm_head_});  // tied: final after the embeddings
  a.dresidual.zero_();
  norm_backward(c, s, Norm{lnf_w_, lnf_b_}, a.dresidual, a.dln, a.residual.back(), a.lnf_mean,
                a.lnf_rstd);
  report_grads_ready({lnf_w_, lnf_b_});

  for (int64_t l = c.n_layer - 1; l >= 0; --l) {
    const Layer& L = layers_[size_t(l)];
    Activations::PerLayer& p = a.layer[size_t(l)];

    // MLP block. dresidual holds d(layer output) = d(mid) before norm2's contribution.
    copy_unless_alias(a.dy, a.dresidual);
    linear_backward(s, L.down, a.dact, false, a.dy, p.act);
    a.dup.zero_();
    if (c.mlp == MlpKind::kGelu) {
      gelu_backward(a.dup, a.dact, p.up);
      linear_backward(s, L.up, a.dln, false, a.dup, p.ln2);
    } else {
      a.dgate.zero_();
      swiglu_backward(a.dgate, a.dup, a.dact, p.gate, p.up);
      linear_backward(s, L.gate, a.dln, false, a.dgate, p.ln2);
      linear_backward(s, L.up, a.dln, true, a.dup, p.ln2);
    }
    norm_backward(c, s, L.norm2, a.dresidual, a.dln, p.mid, p.ln2_mean, p.ln2_rstd);

    // Attention block. dresidual now holds d(mid) = d(layer input) before norm1's contribution.
    copy_unless_alias(a.dy, a.dresidual);
    Tensor datt = a.datt.view({N, C});
    linear_backward(s, L.out, datt, false, a.dy, p.att.view({N, C}));
    a.dq.zero_();
    a.dk.zero_();
    a.dv.zero_();
    attention_backward(a.dq, a.dk, a.dv, a.datt, p.q, p.k, p.v, p.att, p.lse);
    Tensor dq = a.dq, dk = a.dk;
    if (c.position == PositionKind::kRope) {
      a.dq_in.zero_();
      a.dk_in.zero_();
      rope_backward(a.dq_in, a.dq, c.rope_theta);
      rope_backward(a.dk_in, a.dk, c.rope_theta);
      dq = a.dq_in;
      dk = a.dk_in;
    }
    Tensor dq2 = dq.view({N, C}), dk2 = dk.view({N, KV}), dv2 = a.dv.view({N, KV});
    if (L.qkv.size() == 1) {
      concat_last_dim(a.dqkv, {&dq2, &dk2, &dv2});
      linear_backward(s, L.qkv[0], a.dln, false, a.dqkv, p.ln1);
    } else {
      linear_backward(s, L.qkv[0], a.dln, false, dq2, p.ln1);
      linear_backward(s, L.qkv[1], a.dln, true, dk2, p.ln1);
      linear_backward(s, L.qkv[2], a.dln, true, dv2, p.ln1);
    }
    norm_backward(c, s, L.norm1, a.dresidual, a.dln, a.residual[size_t(l)], p.ln1_mean, p.ln1_rstd);
    report_layer_grads_ready(L);
  }

  // Embeddings.
  Tensor dwte = s.grad(wte_);
  embedding_backward(dwte, a.dresidual, a.tokens.view({N}));
  if (c.position == PositionKind::kLearned) {
    Tensor dwpe = s.grad(wpe_);
    position_embedding_backward(dwpe, a.dresidual.view({B, T, C}));
  }
  report_grads_ready({wte_, wpe_});
}

}  // namespace lattice
