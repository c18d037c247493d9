#include "model/transformer.h"

#include <cstring>
#include <optional>

#include "core/kernel_profile.h"
#include "core/rank_progress.h"
#include "kernels/activations.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/normalization.h"
#include "kernels/rope.h"
#include "model/moe_router.h"

namespace lattice {

namespace {

// A linear map's parameters as this rank holds them. GPT-2's Conv1D stores the weight [in, out]
// (y = x·W); Llama's Linear stores it [out, in] (y = x·Wᵀ). A replicated kv projection is used
// only in part: output features [out_first, out_first + out_count) (Llama layout, so rows).
struct Linear {
  int weight = -1;
  int bias = -1;
  bool in_out = false;
  int64_t out_first = 0;
  int64_t out_count = 0;  // 0: all
  // The kernel profile's names of its three GEMMs (core/kernel_profile.h), by role.
  std::string profile_forward = {}, profile_input_grad = {}, profile_weight_grad = {};
};

struct Norm {
  int weight = -1;
  int bias = -1;
};

// A parameter prefix's role, the same in every layer: "transformer.h.3.attn.c_attn" ->
// "attn.c_attn".
std::string gemm_role(const std::string& prefix) {
  for (size_t dot = prefix.size(); dot-- > 0;) {
    if (prefix[dot] != '.' || dot == 0 ||
        !std::isdigit(static_cast<unsigned char>(prefix[dot - 1])))
      continue;
    return prefix.substr(dot + 1);
  }
  return prefix;
}

Linear find_linear(const ParameterRegistry& r, const std::string& prefix, bool in_out) {
  Linear l{r.find(prefix + ".weight"), r.find(prefix + ".bias"), in_out};
  const std::string role = gemm_role(prefix);
  l.profile_forward = "gemm " + role + " fwd";
  l.profile_input_grad = "gemm " + role + " dx";
  l.profile_weight_grad = "gemm " + role + " dw";
  LATTICE_CHECK(l.weight >= 0, "missing parameter {}.weight", prefix);
  return l;
}

Norm find_norm(const ParameterRegistry& r, const std::string& prefix) {
  Norm n{r.find(prefix + ".weight"), r.find(prefix + ".bias")};
  LATTICE_CHECK(n.weight >= 0, "missing parameter {}.weight", prefix);
  return n;
}

// The used part of a linear map's weight (or its gradient) and bias.
Tensor used_weight(const Linear& l, const Tensor& w) {
  return l.out_count > 0 ? w.slice_rows(l.out_first, l.out_first + l.out_count) : w;
}
Tensor used_bias(const Linear& l, const Tensor& b) {
  return l.out_count > 0 ? b.slice_rows(l.out_first, l.out_first + l.out_count) : b;
}

// 2 FLOPs per multiply-add of out (rows × cols) = a (rows × k) · b: k is a's last dimension.
double gemm_flops(const Tensor& out, const Tensor& a) {
  return 2.0 * double(out.numel()) * double(a.shape().dims().back());
}

// y (N, out) = x (N, in) · W (+ b unless the bias is added after a reduction).
void linear_forward(const ParameterStore& s, const Linear& l, Tensor& y, const Tensor& x,
                    bool add_bias = true) {
  Tensor bias = l.bias >= 0 && add_bias ? used_bias(l, s.master(l.bias)) : Tensor();
  const Tensor w = used_weight(l, s.compute(l.weight));
  const KernelTimer timer(l.profile_forward, gemm_flops(y, x),
                          double(x.nbytes() + w.nbytes() + y.nbytes()));
  matmul(y, x, w, bias, {.transpose_b = !l.in_out});
}

// dx (=, or += with accumulate_dx) dy · Wᵀ.
void linear_backward_input(const ParameterStore& s, const Linear& l, Tensor& dx, bool accumulate_dx,
                           const Tensor& dy) {
  const Tensor w = used_weight(l, s.compute(l.weight));
  const KernelTimer timer(l.profile_input_grad, gemm_flops(dx, dy),
                          double(dx.nbytes() + dy.nbytes() + w.nbytes()));
  matmul(dx, dy, w, Tensor(), {.transpose_b = l.in_out, .accumulate = accumulate_dx});
}

// dW += xᵀ·dy (or dyᵀ·x); db += Σ rows of dy unless the bias was added after a reduction (its
// gradient is then taken by the caller).
void linear_backward_weight(const ParameterStore& s, const Linear& l, const Tensor& dy,
                            const Tensor& x, bool bias_grad = true) {
  Tensor dw = used_weight(l, s.grad(l.weight));
  // dW (in × out) sums over the rows of dy.
  const double rows = double(dy.numel()) / double(dy.shape().dims().back());
  const KernelTimer timer(l.profile_weight_grad, 2.0 * double(dw.numel()) * rows,
                          double(dw.nbytes() + dy.nbytes() + x.nbytes()));
  if (l.in_out) {
    matmul(dw, x, dy, Tensor(), {.transpose_a = true, .accumulate = true});
  } else {
    matmul(dw, dy, x, Tensor(), {.transpose_a = true, .accumulate = true});
  }
  if (l.bias >= 0 && bias_grad) {
    Tensor db = used_bias(l, s.grad(l.bias));
    bias_backward(db, dy);
  }
}

}  // namespace

struct Transformer::Layer {
  bool held = false;  // this rank holds the layer (pipeline parallelism)
  Norm norm1, norm2;
  std::vector<Linear> qkv;  // GPT-2: one fused c_attn; Llama: q_proj, k_proj, v_proj
  Linear out;               // attention output projection (row-parallel)
  Linear up;                // GELU: c_fc; SwiGLU: the "up" branch (column-parallel)
  Linear gate;              // SwiGLU only (column-parallel)
  Linear down;              // MLP output projection (row-parallel)
  // Mixture of experts: the router and each expert's maps (w1: the gate, or GELU's input; w3:
  // SwiGLU's up; w2: down), indexed by expert. up, gate and down above stay unused.
  bool moe = false;
  Linear router;
  std::vector<Linear> expert_gate, expert_up, expert_down;
};

// One micro-batch's activations (forward), in its slot. Shapes use the letters of
// kernels/README.md with this rank's sizes: N rows of the micro-batch, R rows of the residual
// stream (N, or N / tp under sequence parallelism), QH query and KH kv heads, Q = QH·HS and
// K = KH·HS their widths, H = d_ff / tp hidden features, W = padded vocabulary slice. cdt is the
// compute dtype. Only the held layers' buffers are allocated.
struct Transformer::Activations {
  int64_t B = 0, T = 0, N = 0, R = 0, first_row = 0;
  Tensor tokens, targets;  // the caller's (B, T) i32
  bool have_targets = false;

  struct PerLayer {
    Tensor ln1, ln1_mean, ln1_rstd;  // (R, C) cdt; (R) f32
    Tensor ln1_full;                 // (N, C) cdt: gathered rows (alias of ln1 without sp)
    Tensor qkv;                      // (N, Q + 2·K) cdt, GPT-2 only
    // (B, T, QH|KH, HS) cdt, after rotary positions; not allocated when attention reads them
    // in qkv (attention_reads_qkv)
    Tensor q, k, v;
    Tensor att, lse;  // (B, T, QH, HS) cdt; (B, QH, T) f32
    Tensor mid;       // (R, C) f32: residual after attention
    Tensor ln2, ln2_mean, ln2_rstd;
    Tensor ln2_full;
    Tensor up, gate, act;  // (N, H) cdt: pre-activation(s) and the activation; (M, H) under MoE
    // Mixture of experts: the router's logits and probabilities (N, E) f32 and logsumexp (N),
    // the routing, the dispatched rows of ln2_full (M, C) cdt and the experts' outputs (M, C)
    // f32, M = N · k packed rows (fewer used when a capacity drops some).
    Tensor router_logits, router_probs, router_lse;
    Tensor dispatched, expert_out;
    Routing routing;
    // The expert side: the rows this rank's experts received (cdt) and their outputs (f32), in
    // blocks (source rank, local expert) at expert_blocks' offsets; aliases of dispatched and
    // expert_out without expert parallelism. send_rows / recv_rows: rows to / from each ep peer.
    Tensor expert_x, expert_y;
    std::vector<int64_t> expert_blocks, send_rows, recv_rows;
  };
  // (L + 1) entries (R, C) f32, defined for the held chunks' layers: input of layer l; entry L
  // is the final output. A chunk's input and output are its first and last entries.
  std::vector<Tensor> residual;
  std::vector<PerLayer> layer;               // (L)
  Tensor lnf, lnf_mean, lnf_rstd, lnf_full;  // head chunk
  Tensor logits, losses;                     // (N, W) f32; (N) f32
  Tensor loss_stats;  // (2, N) f32: each row's max and Σ exp, kept for the backward (tp = 1)
  std::optional<VocabParallelCrossEntropy> vocab_loss;  // tp > 1
  // Per local chunk: the received gradient of its output, the gradient of its input to send.
  std::vector<Tensor> output_grad, input_grad;  // (R, C) f32

  // Deferred weight gradients (zero-bubble schedules): the output gradients of a layer's linear
  // maps, kept from its input-gradient pass until its weight pass. Allocated on first use.
  struct WeightGradInputs {
    Tensor dy_mlp, dup, dgate;  // (N, C), (N, H), (N, H) cdt
    Tensor dy_attn, dqkv;       // (N, C), (N, Q + 2·K) cdt: GPT-2's fused projection
    Tensor dq, dk, dv;          // (N, Q), (N, K), (N, K) cdt: Llama's three
  };
  std::vector<WeightGradInputs> deferred;  // (L)
};

// Scratch shared by all slots: temporaries of one layer's forward and everything of backward.
struct Transformer::Scratch {
  int64_t B = 0, T = 0;
  Tensor proj_full;         // (N, C) f32: a row-parallel output before its reduction
  Tensor proj;              // (R, C) f32: after it (alias of proj_full without sp)
  Tensor dresidual;         // (R, C) f32
  Tensor dln_full;          // (N, C) f32: partial gradient of a norm's output
  Tensor dln;               // (R, C) f32: after its reduction (alias without sp)
  Tensor dy;                // (R, C) cdt: dresidual as a matmul operand (alias when f32)
  Tensor dy_full;           // (N, C) cdt: gathered (alias without sp)
  Tensor dresidual_full;    // (N, C) f32: gathered for the embedding (alias without sp)
  Tensor datt;              // (B, T, QH, HS) cdt
  Tensor dq, dk, dv;        // gradients of q, k, v after rotary
  Tensor dq_in, dk_in;      // before rotary (RoPE only)
  Tensor dqkv;              // GPT-2 only
  Tensor dact, dup, dgate;  // (N, H) cdt; (M, H) under MoE
  Tensor dlogits;           // (N, W) cdt (bf16 only; f32 reuses logits)
  // Mixture of experts: gradients of the experts' outputs (M, C) cdt, of the dispatched rows
  // (M, C) f32, of the gates (N · k) f32 and of the router's logits (N, E) f32 and as a matmul
  // operand (cdt; alias when f32).
  Tensor dexpert_out, ddispatched, dgates, drouter, drouter_c;
  // The expert side's gradients (aliases without expert parallelism): of the received rows'
  // outputs (cdt) and of the received rows (f32).
  Tensor dexpert_y, dexpert_x;
  // Recompute: one layer's forward buffers shared by all layers and slots (full), or only the
  // attention core's (selective).
  Activations::PerLayer recomputed;
};

Transformer::Transformer(ModelConfig config, Arena& arena, DType compute_dtype, TensorParallel tp,
                         const ModelPart& part, ZeroSharding zero, ContextParallel cp,
                         ExpertParallel ep)
    : config_(std::move(config)),
      arena_(arena),
      compute_dtype_(compute_dtype),
      tp_(std::move(tp)),
      cp_(cp),
      ep_(ep),
      registry_(config_, tp_.layout(), part, ep_.layout()),
      store_(registry_, arena, compute_dtype, zero) {
  const ParameterRegistry& r = registry_;
  const bool gpt2 = config_.family == ModelFamily::kGpt2;
  const TensorParallelHeads& heads = r.heads();
  wte_ = r.find(gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight");
  wpe_ = r.find(gpt2 ? "transformer.wpe.weight" : "model.embed_positions.weight");
  if (r.part().has_head()) {
    Norm lnf = find_norm(r, gpt2 ? "transformer.ln_f" : "model.norm");
    lnf_w_ = lnf.weight;
    lnf_b_ = lnf.bias;
    lm_head_ = config_.tied_embeddings ? wte_ : r.find("lm_head.weight");
  }
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    Layer layer;
    layer.held = r.part().holds_layer(l);
    if (!layer.held) {
      layers_.push_back(layer);
      continue;
    }
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
      if (heads.kv_replicated) {
        for (int i = 1; i <= 2; ++i) {
          layer.qkv[size_t(i)].out_first = heads.kv_head_first * config_.head_size();
          layer.qkv[size_t(i)].out_count = heads.kv_heads * config_.head_size();
        }
      }
      layer.out = find_linear(r, h + "self_attn.o_proj", false);
      layer.norm2 = find_norm(r, h + "post_attention_layernorm");
      if (config_.moe()) {
        const std::string moe = h + "block_sparse_moe.";
        layer.moe = true;
        layer.router = find_linear(r, moe + "gate", false);
        const int64_t first = ep_.layout().first(config_.n_experts);
        for (int64_t e = first; e < first + ep_.layout().count(config_.n_experts); ++e) {
          const std::string expert = fmt::format("{}experts.{}.", moe, e);
          // One profile row per map for all experts: "gemm expert w1 fwd".
          auto expert_linear = [&](const char* map) {
            Linear lin = find_linear(r, expert + map, false);
            lin.profile_forward = fmt::format("gemm expert {} fwd", map);
            lin.profile_input_grad = fmt::format("gemm expert {} dx", map);
            lin.profile_weight_grad = fmt::format("gemm expert {} dw", map);
            return lin;
          };
          if (config_.mlp == MlpKind::kSwiglu) {
            layer.expert_gate.push_back(expert_linear("w1"));
            layer.expert_up.push_back(expert_linear("w3"));
          } else {
            layer.expert_up.push_back(expert_linear("w1"));
          }
          layer.expert_down.push_back(expert_linear("w2"));
        }
        layers_.push_back(layer);
        continue;
      }
      if (config_.mlp == MlpKind::kSwiglu) layer.gate = find_linear(r, h + "mlp.gate_proj", false);
      layer.up = find_linear(r, h + "mlp.up_proj", false);
      layer.down = find_linear(r, h + "mlp.down_proj", false);
    }
    layers_.push_back(layer);
  }
  expert_tokens_.assign(size_t(config_.n_layer * config_.n_experts), 0);
  expert_dropped_.assign(expert_tokens_.size(), 0);
  int64_t partial = 0;
  for (const ParameterSpec& spec : r.specs())
    partial += spec.partial_grad ? spec.local_shape.numel() : 0;
  if (partial > 0) {
    partial_grads_ = Tensor::empty(arena_, {partial}, DType::kF32, MemoryCategory::kGradients);
  }
}

Transformer::~Transformer() = default;

// This rank's sizes of a (B, T) micro-batch, in the letters of the Activations comment.
struct Transformer::Sizes {
  bool sp = false;  // sequence parallelism over more than one rank
  int64_t N = 0, R = 0, C = 0, H = 0, HS = 0, QH = 0, KH = 0, Q = 0, K = 0;
  int64_t M = 0;  // rows of the MLP's hidden state: N, or N · k packed rows under MoE
  int64_t X = 0;  // rows a rank's experts may receive: M, or ep · M under expert parallelism
  int64_t E = 0;  // experts (0: dense)
};

Transformer::Sizes Transformer::sizes(int64_t B, int64_t T) const {
  const TensorParallelHeads& heads = registry_.heads();
  Sizes z;
  z.sp = tp_.sequence_parallel() && tp_.size() > 1;
  z.N = B * T;
  z.R = z.sp ? z.N / tp_.size() : z.N;
  z.C = config_.d_model;
  z.H = config_.d_ff / tp_.size();
  z.HS = config_.head_size();
  z.QH = heads.q_heads;
  z.KH = heads.kv_heads;
  z.Q = z.QH * z.HS;
  z.K = z.KH * z.HS;
  z.E = config_.n_experts;
  z.M = config_.moe() ? max_padded_rows(z.N * config_.experts_per_token, z.E) : z.N;
  z.X = z.M * ep_.size();
  return z;
}

Tensor Transformer::activation_buffer(Shape shape, DType dtype) const {
  return Tensor::empty(arena_, std::move(shape), dtype, MemoryCategory::kActivations);
}

// Under sequence parallelism a gathered copy (N, ...) of this rank's rows; otherwise the rows.
Tensor Transformer::gathered_rows(const Tensor& rows, Shape full) const {
  return tp_.sequence_parallel() && tp_.size() > 1
             ? activation_buffer(std::move(full), rows.dtype())
             : rows;
}

namespace {

// A layer's MLP buffers: the hidden state's pre-activation(s) and activation, and under MoE the
// router's and the dispatch's.
// M: the packed rows this rank sends; X: the rows its experts may receive (M, or ep · M under
// expert parallelism: every peer may send all its rows to one rank's experts).
template <class Alloc, class PerLayer>
void alloc_mlp(Alloc alloc, PerLayer& p, int64_t N, int64_t M, int64_t X, int64_t C, int64_t H,
               int64_t E, DType cdt, bool swiglu) {
  p.up = alloc(Shape{X, H}, cdt);
  if (swiglu) p.gate = alloc(Shape{X, H}, cdt);
  p.act = alloc(Shape{X, H}, cdt);
  if (E == 0) return;
  p.router_logits = alloc(Shape{N, E}, DType::kF32);
  p.router_probs = alloc(Shape{N, E}, DType::kF32);
  p.router_lse = alloc(Shape{N}, DType::kF32);
  p.dispatched = alloc(Shape{M, C}, cdt);
  p.expert_out = alloc(Shape{M, C}, DType::kF32);
  p.expert_x = X == M ? p.dispatched : alloc(Shape{X, C}, cdt);
  p.expert_y = X == M ? p.expert_out : alloc(Shape{X, C}, DType::kF32);
}

}  // namespace

Transformer::Activations& Transformer::slot_activations(int slot, int64_t B, int64_t T) {
  LATTICE_CHECK(slot >= 0 && slot < 1024, "activation slot {}", slot);
  if (size_t(slot) >= slots_.size()) slots_.resize(size_t(slot) + 1);
  std::unique_ptr<Activations>& held = slots_[size_t(slot)];
  if (held && held->B == B && held->T == T) return *held;
  held.reset();  // return the old buffers to the arena before allocating new ones
  auto a = std::make_unique<Activations>();
  const ModelConfig& c = config_;
  const ModelPart& part = registry_.part();
  const Sizes z = sizes(B, T);
  const int64_t N = z.N, R = z.R, C = z.C, H = z.H, HS = z.HS, QH = z.QH, KH = z.KH, Q = z.Q,
                K = z.K;
  const DType cdt = compute_dtype_;
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const bool swiglu = c.mlp == MlpKind::kSwiglu;
  auto alloc = [&](Shape shape, DType dtype) { return activation_buffer(std::move(shape), dtype); };
  auto gathered = [&](const Tensor& rows, Shape shape) {
    return gathered_rows(rows, std::move(shape));
  };
  a->B = B;
  a->T = T;
  a->N = N;
  a->R = R;
  a->first_row = z.sp ? R * tp_.rank() : 0;
  a->residual.resize(size_t(c.n_layer + 1));
  a->layer.resize(size_t(c.n_layer));
  for (const LayerChunk& chunk : part.chunks) {
    for (int64_t l = chunk.first_layer; l <= chunk.last_layer; ++l) {
      a->residual[size_t(l)] = alloc({R, C}, DType::kF32);
    }
    a->output_grad.push_back(chunk.head ? Tensor() : alloc({R, C}, DType::kF32));
    a->input_grad.push_back(chunk.embedding ? Tensor() : alloc({R, C}, DType::kF32));
  }
  Scratch& w = scratch(B, T);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!layers_[size_t(l)].held) continue;
    Activations::PerLayer& p = a->layer[size_t(l)];
    if (recompute_ == Recompute::kFull) {
      p = w.recomputed;  // views of the shared buffers: nothing kept but the layer's input
      continue;
    }
    p.ln1 = alloc({R, C}, cdt);
    p.ln1_mean = alloc({R}, DType::kF32);
    p.ln1_rstd = alloc({R}, DType::kF32);
    p.ln1_full = gathered(p.ln1, {N, C});
    if (gpt2) p.qkv = alloc({N, Q + 2 * K}, cdt);
    if (!attention_reads_qkv()) {
      p.q = alloc({B, T, QH, HS}, cdt);
      p.k = alloc({B, T, KH, HS}, cdt);
      p.v = alloc({B, T, KH, HS}, cdt);
    }
    if (recompute_ == Recompute::kSelective) {
      p.att = w.recomputed.att;
      p.lse = w.recomputed.lse;
    } else {
      p.att = alloc({B, T, QH, HS}, cdt);
      p.lse = alloc({B, QH, T}, DType::kF32);
    }
    p.mid = alloc({R, C}, DType::kF32);
    p.ln2 = alloc({R, C}, cdt);
    p.ln2_mean = alloc({R}, DType::kF32);
    p.ln2_rstd = alloc({R}, DType::kF32);
    p.ln2_full = gathered(p.ln2, {N, C});
    alloc_mlp(alloc, p, N, z.M, z.X, C, H, z.E, cdt, swiglu);
  }
  if (part.has_head()) {
    const int64_t W = registry_.at(lm_head_).local_shape[0];
    a->lnf = alloc({R, C}, cdt);
    a->lnf_mean = alloc({R}, DType::kF32);
    a->lnf_rstd = alloc({R}, DType::kF32);
    a->lnf_full = gathered(a->lnf, {N, C});
    a->logits = alloc({N, W}, DType::kF32);
    a->losses = alloc({N}, DType::kF32);
    if (tp_.size() > 1) {
      a->vocab_loss.emplace(arena_, N);
    } else {
      a->loss_stats = alloc({2, N}, DType::kF32);
    }
  }
  held = std::move(a);
  return *held;
}

Transformer::Scratch& Transformer::scratch(int64_t B, int64_t T) {
  if (scratch_ && scratch_->B == B && scratch_->T == T) return *scratch_;
  scratch_.reset();
  auto w = std::make_unique<Scratch>();
  const ModelConfig& c = config_;
  const ModelPart& part = registry_.part();
  const Sizes z = sizes(B, T);
  const int64_t N = z.N, R = z.R, C = z.C, H = z.H, QH = z.QH, KH = z.KH, Q = z.Q, K = z.K,
                HS = z.HS;
  const bool sp = z.sp;
  const DType cdt = compute_dtype_;
  auto alloc = [&](Shape shape, DType dtype) { return activation_buffer(std::move(shape), dtype); };
  auto gathered = [&](const Tensor& rows, Shape shape) {
    return gathered_rows(rows, std::move(shape));
  };
  w->B = B;
  w->T = T;
  w->proj_full = alloc({N, C}, DType::kF32);
  w->proj = sp ? alloc({R, C}, DType::kF32) : w->proj_full;
  w->dresidual = alloc({R, C}, DType::kF32);
  w->dln_full = alloc({N, C}, DType::kF32);
  w->dln = sp ? alloc({R, C}, DType::kF32) : w->dln_full;
  w->dy = cdt == DType::kF32 ? w->dresidual : alloc({R, C}, cdt);
  w->dy_full = gathered(w->dy, {N, C});
  w->dresidual_full = gathered(w->dresidual, {N, C});
  w->datt = alloc({B, T, QH, HS}, cdt);
  if (!attention_reads_qkv()) {
    w->dq = alloc({B, T, QH, HS}, cdt);
    w->dk = alloc({B, T, KH, HS}, cdt);
    w->dv = alloc({B, T, KH, HS}, cdt);
  }
  if (c.position == PositionKind::kRope) {
    w->dq_in = alloc({B, T, QH, HS}, cdt);
    w->dk_in = alloc({B, T, KH, HS}, cdt);
  }
  if (c.family == ModelFamily::kGpt2) w->dqkv = alloc({N, Q + 2 * K}, cdt);
  w->dact = alloc({z.X, H}, cdt);
  w->dup = alloc({z.X, H}, cdt);
  if (c.mlp == MlpKind::kSwiglu) w->dgate = alloc({z.X, H}, cdt);
  if (c.moe()) {
    w->dexpert_out = alloc({z.M, C}, cdt);
    w->ddispatched = alloc({z.M, C}, DType::kF32);
    w->dgates = alloc({N * c.experts_per_token}, DType::kF32);
    w->drouter = alloc({N, z.E}, DType::kF32);
    w->drouter_c = cdt == DType::kF32 ? w->drouter : alloc({N, z.E}, cdt);
    w->dexpert_y = z.X == z.M ? w->dexpert_out : alloc({z.X, C}, cdt);
    w->dexpert_x = z.X == z.M ? w->ddispatched : alloc({z.X, C}, DType::kF32);
  }
  if (cdt != DType::kF32 && part.has_head()) {
    w->dlogits = alloc({N, registry_.at(lm_head_).local_shape[0]}, cdt);
  }
  Activations::PerLayer& p = w->recomputed;
  if (recompute_ != Recompute::kNone) {
    p.att = alloc({B, T, QH, HS}, cdt);
    p.lse = alloc({B, QH, T}, DType::kF32);
  }
  if (recompute_ == Recompute::kFull) {
    const bool swiglu = c.mlp == MlpKind::kSwiglu;
    p.ln1 = alloc({R, C}, cdt);
    p.ln1_mean = alloc({R}, DType::kF32);
    p.ln1_rstd = alloc({R}, DType::kF32);
    p.ln1_full = gathered(p.ln1, {N, C});
    if (c.family == ModelFamily::kGpt2) p.qkv = alloc({N, Q + 2 * K}, cdt);
    if (!attention_reads_qkv()) {
      p.q = alloc({B, T, QH, HS}, cdt);
      p.k = alloc({B, T, KH, HS}, cdt);
      p.v = alloc({B, T, KH, HS}, cdt);
    }
    p.mid = alloc({R, C}, DType::kF32);
    p.ln2 = alloc({R, C}, cdt);
    p.ln2_mean = alloc({R}, DType::kF32);
    p.ln2_rstd = alloc({R}, DType::kF32);
    p.ln2_full = gathered(p.ln2, {N, C});
    alloc_mlp(alloc, p, N, z.M, z.X, C, H, z.E, cdt, swiglu);
  }
  scratch_ = std::move(w);
  return *scratch_;
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

// The rows [first_row, first_row + R) of the micro-batch, in runs that stay inside one sequence.
// Runs of rows whose global positions are consecutive: within one sequence and, under context
// parallelism, within one of its chunks.
void Transformer::add_positions(Tensor& rows, int64_t first_row, int64_t T) const {
  const int64_t R = rows.dim(0), C = rows.dim(1);
  const ContextParallel whole;
  const ContextParallel& cp = context_parallel_on() ? cp_ : whole;
  for (int64_t r = 0; r < R;) {
    const int64_t t = (first_row + r) % T;
    const int64_t count = std::min(R - r, cp.consecutive_positions(t, T));
    Tensor run = rows.slice_rows(r, r + count).view({1, count, C});
    position_embedding_forward(run, store_.master(wpe_), cp.global_position(t, T));
    r += count;
  }
}

void Transformer::position_grads(const Tensor& drows, int64_t first_row, int64_t T) const {
  const int64_t R = drows.dim(0), C = drows.dim(1);
  const ContextParallel whole;
  const ContextParallel& cp = context_parallel_on() ? cp_ : whole;
  Tensor dwpe = store_.grad(wpe_);
  for (int64_t r = 0; r < R;) {
    const int64_t t = (first_row + r) % T;
    const int64_t count = std::min(R - r, cp.consecutive_positions(t, T));
    position_embedding_backward(dwpe, drows.slice_rows(r, r + count).view({1, count, C}),
                                cp.global_position(t, T));
    r += count;
  }
}

void Transformer::rotate(Tensor& out, const Tensor& in, bool backward) const {
  const float theta = config_.rope_theta;
  if (!context_parallel_on()) {
    backward ? rope_backward(out, in, theta) : rope_forward(out, in, theta);
    return;
  }
  // (B, T, H, HS) as (2B, T / 2, H, HS): entry 2b + j is chunk j of sequence b.
  const int64_t B = in.dim(0), T = in.dim(1), H = in.dim(2), HS = in.dim(3), c = T / 2;
  const Tensor in_chunks = in.view({2 * B, c, H, HS});
  const Tensor out_chunks = out.view({2 * B, c, H, HS});
  for (int64_t j = 0; j < 2; ++j) {
    const int64_t offset = cp_.global_position(j * c, T);
    for (int64_t b = 0; b < B; ++b) {
      const Tensor x = in_chunks.slice_rows(2 * b + j, 2 * b + j + 1);
      Tensor y = out_chunks.slice_rows(2 * b + j, 2 * b + j + 1);
      backward ? rope_backward(y, x, theta, offset) : rope_forward(y, x, theta, offset);
    }
  }
}

bool Transformer::attention_reads_qkv() const {
  return config_.family == ModelFamily::kGpt2 && config_.position != PositionKind::kRope &&
         !context_parallel_on();
}

void Transformer::attention(Activations& a, int64_t l) {
  Activations::PerLayer& p = a.layer[size_t(l)];
  if (context_parallel_on()) {
    cp_.attention_forward(arena_, p.att, p.lse, p.q, p.k, p.v,
                          fmt::format("layer {} attention", l));
  } else if (attention_reads_qkv()) {
    attention_forward_qkv(p.att, p.lse, p.qkv);
  } else {
    attention_forward(p.att, p.lse, p.q, p.k, p.v);
  }
}

// Forward of one chunk for one micro-batch. With tensor parallelism the two collectives of each
// block are the Megatron pair: before a column-parallel map the input must be whole (all-gather
// of the rows under sequence parallelism, nothing otherwise); after a row-parallel map the
// partial sums are reduced (reduce-scatter under sequence parallelism, all-reduce otherwise).
ForwardResult Transformer::forward(const Tensor& tokens, const Tensor& targets) {
  LATTICE_CHECK(
      chunk_count() == 1 && registry_.part().has_embedding() && registry_.part().has_head(),
      "forward() runs the whole model; a pipeline stage runs forward_chunk()");
  return forward_chunk(0, 0, tokens, targets);
}

void Transformer::backward(float loss_scale) {
  backward_chunk(0, 0, loss_scale);
}

ForwardResult Transformer::forward_chunk(int chunk, int slot, const Tensor& tokens,
                                         const Tensor& targets) {
  expect_dtype(tokens, DType::kI32, "Transformer::forward", "tokens");
  expect_rank(tokens, 2, "Transformer::forward", "tokens");
  LATTICE_CHECK(chunk >= 0 && chunk < chunk_count(), "chunk {} of {}", chunk, chunk_count());
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  if (T > config_.seq_len) {
    LATTICE_THROW(ShapeError,
                  "Transformer::forward: sequence length {} exceeds the model's seq_len {} "
                  "---> HINT: lower the batch's T or raise model.seq_len",
                  T, config_.seq_len);
  }
  const bool sp = tp_.sequence_parallel() && tp_.size() > 1;
  if (sp && (B * T) % tp_.size() != 0) {
    LATTICE_THROW(ShapeError,
                  "Transformer::forward: sequence parallelism splits the {}·{} = {} token rows of "
                  "a micro-batch over --tp {}, which does not divide them ---> HINT: choose a "
                  "micro-batch size or sequence length whose product divides by {}",
                  B, T, B * T, tp_.size(), tp_.size());
  }
  if (context_parallel_on() && T % 2 != 0) {
    LATTICE_THROW(ShapeError,
                  "Transformer::forward: under context parallelism a rank's {} positions are two "
                  "equal chunks of each sequence ---> HINT: pass this rank's chunks "
                  "(ContextParallel::take_local_positions) of a sequence that splits into 2·cp",
                  T);
  }
  if (targets.defined()) {
    expect_dtype(targets, DType::kI32, "Transformer::forward", "targets");
    expect_same_shape(tokens, targets, "Transformer::forward", "tokens", "targets");
  }
  const LayerChunk& part = registry_.part().chunks[size_t(chunk)];
  Activations& a = slot_activations(slot, B, T);
  Scratch& w = scratch(B, T);
  const ModelConfig& c = config_;
  const ParameterStore& s = store_;
  const int64_t N = a.N;
  a.tokens = tokens;
  a.targets = targets;
  a.have_targets = targets.defined();
  ParameterHooks* hooks = parameter_hooks_;
  if (hooks != nullptr && (part.embedding || part.head))
    hooks->before_forward(ParameterHooks::kEnds);

  if (part.embedding) {
    // Embeddings (f32 master tables) into the residual stream. Each rank looks up the tokens of
    // its vocabulary slice (zeros for the others): the sum over the group is the full lookup.
    Tensor ids = tokens.view({N});
    Tensor& x = a.residual[size_t(part.first_layer)];
    if (sp) {
      embedding_forward(w.proj_full, ids, s.master(wte_), registry_.vocab_start());
      tp_.reduce_scatter_rows(x, w.proj_full, "embedding (fwd)");
    } else {
      embedding_forward(x, ids, s.master(wte_), registry_.vocab_start());
      tp_.all_reduce(x, "embedding (fwd)");
    }
    if (c.position == PositionKind::kLearned) add_positions(x, a.first_row, T);
  }
  ForwardResult result;
  for (int64_t l = part.first_layer; l < part.last_layer; ++l) {
    if (hooks != nullptr) hooks->before_forward(l);
    result.router_loss_sum += layer_forward(a, w, l);
    if (hooks != nullptr) hooks->after_forward(l);
    report_progress();
  }
  if (!part.head) return result;

  Norm lnf{lnf_w_, lnf_b_};
  norm_forward(c, s, lnf, a.lnf, a.lnf_mean, a.lnf_rstd, a.residual[size_t(part.last_layer)]);
  if (sp) tp_.all_gather_rows(a.lnf_full, a.lnf, "ln_f (fwd)");
  // logits (N, W) = lnf · Wᵀ with W (W, C): this rank's rows of the token table or the head.
  {
    const KernelTimer timer(
        "gemm lm_head fwd", gemm_flops(a.logits, a.lnf_full),
        double(a.logits.nbytes() + a.lnf_full.nbytes() + s.compute(lm_head_).nbytes()));
    matmul(a.logits, a.lnf_full, s.compute(lm_head_), Tensor(), {.transpose_b = true});
  }
  report_progress();
  if (targets.defined()) {
    if (a.vocab_loss) {
      result.token_count =
          a.vocab_loss->forward(tp_, a.losses, a.logits, targets.view({N}),
                                {registry_.vocab_start(), registry_.vocab_valid()}, c.vocab_size);
    } else {
      result.token_count =
          cross_entropy_forward(a.losses, a.logits, targets.view({N}), kIgnoreIndex, a.loss_stats);
    }
    const float* losses = a.losses.data<float>();
    for (int64_t i = 0; i < N; ++i) result.loss_sum += double(losses[i]);
  }
  return result;
}

double Transformer::layer_forward(Activations& a, Scratch& w, int64_t l) {
  const ModelConfig& c = config_;
  const ParameterStore& s = store_;
  const bool sp = tp_.sequence_parallel() && tp_.size() > 1;
  const int64_t N = a.N, HS = c.head_size();
  const int64_t Q = registry_.heads().q_heads * HS, K = registry_.heads().kv_heads * HS;
  const Layer& L = layers_[size_t(l)];
  Activations::PerLayer& p = a.layer[size_t(l)];
  // Attention block: mid = x + out_proj(attention(norm1(x))).
  norm_forward(c, s, L.norm1, p.ln1, p.ln1_mean, p.ln1_rstd, a.residual[size_t(l)]);
  if (sp) tp_.all_gather_rows(p.ln1_full, p.ln1, fmt::format("layer {} ln_1 (fwd)", l));
  if (attention_reads_qkv()) {
    linear_forward(s, L.qkv[0], p.qkv, p.ln1_full);
  } else {
    Tensor q = p.q.view({N, Q}), k = p.k.view({N, K}), v = p.v.view({N, K});
    if (L.qkv.size() == 1) {
      linear_forward(s, L.qkv[0], p.qkv, p.ln1_full);
      split_last_dim({&q, &k, &v}, p.qkv);
    } else {
      linear_forward(s, L.qkv[0], q, p.ln1_full);
      linear_forward(s, L.qkv[1], k, p.ln1_full);
      linear_forward(s, L.qkv[2], v, p.ln1_full);
    }
    if (c.position == PositionKind::kRope) {
      rotate(p.q, p.q, false);
      rotate(p.k, p.k, false);
    }
  }
  attention(a, l);
  linear_forward(s, L.out, w.proj_full, p.att.view({N, Q}), false);
  if (sp) {
    tp_.reduce_scatter_rows(w.proj, w.proj_full, fmt::format("layer {} attn out (fwd)", l));
  } else {
    tp_.all_reduce(w.proj_full, fmt::format("layer {} attn out (fwd)", l));
  }
  if (L.out.bias >= 0) bias_forward(w.proj, s.master(L.out.bias));
  add(p.mid, a.residual[size_t(l)], w.proj);

  // MLP block: out = mid + down(act(up(norm2(mid)))).
  norm_forward(c, s, L.norm2, p.ln2, p.ln2_mean, p.ln2_rstd, p.mid);
  if (sp) tp_.all_gather_rows(p.ln2_full, p.ln2, fmt::format("layer {} ln_2 (fwd)", l));
  double router_loss = 0.0;
  if (L.moe) {
    router_loss = moe_forward(a, w, l);
  } else {
    linear_forward(s, L.up, p.up, p.ln2_full);
    if (c.mlp == MlpKind::kGelu) {
      gelu_forward(p.act, p.up);
    } else {
      linear_forward(s, L.gate, p.gate, p.ln2_full);
      swiglu_forward(p.act, p.gate, p.up);
    }
    linear_forward(s, L.down, w.proj_full, p.act, false);
  }
  if (sp) {
    tp_.reduce_scatter_rows(w.proj, w.proj_full, fmt::format("layer {} mlp out (fwd)", l));
  } else {
    tp_.all_reduce(w.proj_full, fmt::format("layer {} mlp out (fwd)", l));
  }
  if (L.down.bias >= 0) bias_forward(w.proj, s.master(L.down.bias));
  add(a.residual[size_t(l) + 1], p.mid, w.proj);
  return router_loss;
}

namespace {

// run(local expert, begin, end) for each non-empty block (source rank, local expert) of the
// rows an expert side holds, blocks at `offsets`.
template <class Run>
void for_each_expert_block(const std::vector<int64_t>& offsets, int64_t local, Run&& run) {
  for (size_t b = 0; b + 1 < offsets.size(); ++b) {
    if (offsets[b] < offsets[b + 1]) run(size_t(int64_t(b) % local), offsets[b], offsets[b + 1]);
  }
}

// Row `row` of a (rows, C) f32 or bf16 tensor as f32.
void read_row(const Tensor& t, int64_t row, float* out) {
  const int64_t C = t.dim(1);
  if (t.dtype() == DType::kF32) {
    const float* src = t.data<float>() + row * C;
    std::copy(src, src + C, out);
  } else {
    convert(static_cast<const std::byte*>(t.raw_data()) + size_t(row * C) * dtype_size(t.dtype()),
            t.dtype(), out, DType::kF32, C);
  }
}

void write_row(Tensor& t, int64_t row, const float* in) {
  const int64_t C = t.dim(1);
  if (t.dtype() == DType::kF32) {
    std::copy(in, in + C, t.data<float>() + row * C);
  } else {
    convert(in, DType::kF32,
            static_cast<std::byte*>(t.raw_data()) + size_t(row * C) * dtype_size(t.dtype()),
            t.dtype(), C);
  }
}

}  // namespace

int64_t Transformer::exchange_to_experts(Activations& a, int64_t l) {
  Activations::PerLayer& p = a.layer[size_t(l)];
  const Routing& r = p.routing;
  const int64_t E = config_.n_experts, n = ep_.size(), local = E / n;
  std::vector<int64_t> rows(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    rows[size_t(e)] = r.expert_begin[size_t(e) + 1] - r.expert_begin[size_t(e)];
  // Blocks (source, local expert); without expert parallelism one source, this rank.
  const std::vector<int64_t> block_rows =
      n == 1 ? rows : ep_.exchange_counts(rows, p.send_rows, p.recv_rows);
  p.expert_blocks.assign(size_t(n * local) + 1, 0);
  for (size_t b = 0; b < block_rows.size(); ++b) {
    p.expert_blocks[b + 1] = p.expert_blocks[b] + block_rows[b];
  }
  if (n > 1) {
    ep_.exchange_rows(p.dispatched.raw_data(), p.send_rows, p.expert_x.raw_data(), p.recv_rows,
                      config_.d_model, p.dispatched.dtype());
  }
  return p.expert_blocks.back();
}

double Transformer::moe_forward(Activations& a, Scratch& w, int64_t l) {
  const ModelConfig& c = config_;
  const ParameterStore& s = store_;
  const Layer& L = layers_[size_t(l)];
  Activations::PerLayer& p = a.layer[size_t(l)];
  const int64_t N = a.N, C = c.d_model, E = c.n_experts, k = c.experts_per_token;
  // Route: every tp rank holds the whole ln2_full and the same router, so routes alike.
  linear_forward(s, L.router, p.router_logits, p.ln2_full);
  route_tokens(c, p.router_logits.data<float>(), N, a.T, p.routing, p.router_probs.data<float>(),
               p.router_lse.data<float>(), /*padded=*/true);
  const Routing& r = p.routing;
  const int64_t M = r.rows();
  if (!recomputing_) {
    for (int64_t e = 0; e < E; ++e) {
      expert_tokens_[size_t(l * E + e)] += r.chosen[size_t(e)] - r.dropped[size_t(e)];
      expert_dropped_[size_t(l * E + e)] += r.dropped[size_t(e)];
    }
  }
  // Dispatch: each packed row is a copy of its token's row.
  {
    const size_t row_bytes = size_t(C) * dtype_size(p.ln2_full.dtype());
    const auto* from = static_cast<const std::byte*>(p.ln2_full.raw_data());
    auto* to = static_cast<std::byte*>(p.dispatched.raw_data());
    for (int64_t m = 0; m < M; ++m) {
      const int32_t t = r.token_of_row[size_t(m)];
      if (t < 0) {
        std::memset(to + size_t(m) * row_bytes, 0, row_bytes);  // padding: the experts map 0 to 0
      } else {
        std::memcpy(to + size_t(m) * row_bytes, from + size_t(t) * row_bytes, row_bytes);
      }
    }
  }
  // To the experts' ranks (dispatch), each local expert on its blocks, and back (combine).
  const int64_t X = exchange_to_experts(a, l);
  const int64_t local = int64_t(L.expert_down.size());
  auto for_each_block = [&](auto&& run) { for_each_expert_block(p.expert_blocks, local, run); };
  for_each_block([&](size_t e, int64_t begin, int64_t end) {
    const Tensor x = p.expert_x.slice_rows(begin, end);
    Tensor up = p.up.slice_rows(begin, end);
    linear_forward(s, L.expert_up[e], up, x);
    if (c.mlp == MlpKind::kSwiglu) {
      Tensor gate = p.gate.slice_rows(begin, end);
      linear_forward(s, L.expert_gate[e], gate, x);
    }
  });
  if (X > 0) {
    Tensor act = p.act.slice_rows(0, X);
    if (c.mlp == MlpKind::kGelu) {
      gelu_forward(act, p.up.slice_rows(0, X));
    } else {
      swiglu_forward(act, p.gate.slice_rows(0, X), p.up.slice_rows(0, X));
    }
  }
  for_each_block([&](size_t e, int64_t begin, int64_t end) {
    Tensor out = p.expert_y.slice_rows(begin, end);
    linear_forward(s, L.expert_down[e], out, p.act.slice_rows(begin, end));
  });
  if (ep_.size() > 1) {
    ep_.exchange_rows(p.expert_y.raw_data(), p.recv_rows, p.expert_out.raw_data(), p.send_rows, C,
                      DType::kF32);
  }
  // Combine: each token's experts weighted by their gates, in slot order.
  w.proj_full.zero_();
  float* y = w.proj_full.data<float>();
  const float* out = p.expert_out.data<float>();
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t slot = 0; slot < k; ++slot) {
      const int32_t m = r.row[size_t(t * k + slot)];
      if (m < 0) continue;
      const float g = r.gate[size_t(t * k + slot)];
      const float* o = out + int64_t(m) * C;
      for (int64_t i = 0; i < C; ++i) y[t * C + i] += g * o[i];
    }
  }
  return router_loss_sum(c, r, p.router_probs.data<float>(), p.router_lse.data<float>(), a.T);
}

void Transformer::moe_backward(Activations& a, Scratch& w, int64_t l) {
  const ModelConfig& c = config_;
  const ParameterStore& s = store_;
  const Layer& L = layers_[size_t(l)];
  Activations::PerLayer& p = a.layer[size_t(l)];
  const int64_t N = a.N, C = c.d_model, k = c.experts_per_token;
  const Routing& r = p.routing;
  const int64_t M = r.rows();
  // Gates and experts' outputs: y_t = Σ g · out_m, so dg = dy_t · out_m and dout_m = g · dy_t.
  float* dgates = w.dgates.data<float>();
  const float* out = p.expert_out.data<float>();
  // Padding rows get a zero gradient, so they add nothing to the experts' weight gradients.
  w.dexpert_out.slice_rows(0, M).zero_();
  std::vector<float> dy(static_cast<size_t>(C)), dout(static_cast<size_t>(C));
  for (int64_t t = 0; t < N; ++t) {
    read_row(w.dy_full, t, dy.data());
    for (int64_t slot = 0; slot < k; ++slot) {
      const size_t i = size_t(t * k + slot);
      const int32_t m = r.row[i];
      dgates[i] = 0.0f;
      if (m < 0) continue;
      const float* o = out + int64_t(m) * C;
      double dot = 0.0;
      for (int64_t j = 0; j < C; ++j) {
        dot += double(dy[size_t(j)]) * o[j];
        dout[size_t(j)] = r.gate[i] * dy[size_t(j)];
      }
      dgates[i] = float(dot);
      write_row(w.dexpert_out, m, dout.data());
    }
  }
  // Each tp rank's experts' outputs are partial sums over its hidden features: so is dg.
  tp_.all_reduce(w.dgates, fmt::format("layer {} router gates (bwd)", l));
  // The outputs' gradients to the experts' ranks, the experts' backward on their blocks, the
  // rows' gradients back: the forward's exchanges reversed.
  if (ep_.size() > 1) {
    ep_.exchange_rows(w.dexpert_out.raw_data(), p.send_rows, w.dexpert_y.raw_data(), p.recv_rows, C,
                      w.dexpert_out.dtype());
  }
  const int64_t X = p.expert_blocks.back();
  const int64_t local = int64_t(L.expert_down.size());
  auto for_each_block = [&](auto&& run) { for_each_expert_block(p.expert_blocks, local, run); };
  for_each_block([&](size_t e, int64_t begin, int64_t end) {
    Tensor dact = w.dact.slice_rows(begin, end);
    const Tensor dy_e = w.dexpert_y.slice_rows(begin, end);
    linear_backward_input(s, L.expert_down[e], dact, false, dy_e);
    linear_backward_weight(s, L.expert_down[e], dy_e, p.act.slice_rows(begin, end));
  });
  if (X > 0) {
    Tensor dup = w.dup.slice_rows(0, X);
    if (c.mlp == MlpKind::kGelu) {
      gelu_backward(dup, w.dact.slice_rows(0, X), p.up.slice_rows(0, X), /*accumulate=*/false);
    } else {
      Tensor dgate = w.dgate.slice_rows(0, X);
      swiglu_backward(dgate, dup, w.dact.slice_rows(0, X), p.gate.slice_rows(0, X),
                      p.up.slice_rows(0, X), /*accumulate=*/false);
    }
  }
  for_each_block([&](size_t e, int64_t begin, int64_t end) {
    const Tensor x = p.expert_x.slice_rows(begin, end);
    Tensor dx = w.dexpert_x.slice_rows(begin, end);
    const Tensor dup = w.dup.slice_rows(begin, end);
    linear_backward_input(s, L.expert_up[e], dx, false, dup);
    linear_backward_weight(s, L.expert_up[e], dup, x);
    if (c.mlp == MlpKind::kSwiglu) {
      const Tensor dgate = w.dgate.slice_rows(begin, end);
      linear_backward_input(s, L.expert_gate[e], dx, true, dgate);
      linear_backward_weight(s, L.expert_gate[e], dgate, x);
    }
  });
  if (ep_.size() > 1) {
    ep_.exchange_rows(w.dexpert_x.raw_data(), p.recv_rows, w.ddispatched.raw_data(), p.send_rows, C,
                      DType::kF32);
  }
  // Combine the dispatched rows' gradients into their tokens', in row order.
  w.dln_full.zero_();
  float* dln = w.dln_full.data<float>();
  const float* dx = w.ddispatched.data<float>();
  for (int64_t m = 0; m < M; ++m) {
    if (r.token_of_row[size_t(m)] < 0) continue;
    float* to = dln + int64_t(r.token_of_row[size_t(m)]) * C;
    for (int64_t j = 0; j < C; ++j) to[j] += dx[m * C + j];
  }
  // Router: its logits' gradient from the gates' and the router losses'. Every tp rank holds
  // the same (the gates' gradient was summed), so its input gradient is added once, on rank 0,
  // to the partial sums that the norm's reduction adds up.
  router_backward(c, r, p.router_probs.data<float>(), p.router_lse.data<float>(), dgates, a.T,
                  backward_loss_scale_, w.drouter.data<float>());
  copy_unless_alias(w.drouter_c, w.drouter);
  linear_backward_weight(s, L.router, w.drouter_c, p.ln2_full);
  if (tp_.rank() == 0) linear_backward_input(s, L.router, w.dln_full, true, w.drouter_c);
}

Tensor& Transformer::chunk_input(int chunk, int slot, int64_t B, int64_t T) {
  const LayerChunk& part = registry_.part().chunks.at(size_t(chunk));
  LATTICE_CHECK(!part.embedding, "the embedding chunk has no input activation");
  return slot_activations(slot, B, T).residual[size_t(part.first_layer)];
}

const Tensor& Transformer::chunk_output(int chunk, int slot) const {
  const LayerChunk& part = registry_.part().chunks.at(size_t(chunk));
  LATTICE_CHECK(size_t(slot) < slots_.size() && slots_[size_t(slot)], "slot {} never used", slot);
  return slots_[size_t(slot)]->residual[size_t(part.last_layer)];
}

Tensor& Transformer::chunk_output_grad(int chunk, int slot, int64_t B, int64_t T) {
  LATTICE_CHECK(!registry_.part().chunks.at(size_t(chunk)).head,
                "the head chunk starts its backward from the loss");
  return slot_activations(slot, B, T).output_grad[size_t(chunk)];
}

const Tensor& Transformer::chunk_input_grad(int chunk, int slot) const {
  LATTICE_CHECK(size_t(slot) < slots_.size() && slots_[size_t(slot)], "slot {} never used", slot);
  return slots_[size_t(slot)]->input_grad.at(size_t(chunk));
}

void Transformer::reset_expert_counts() {
  std::fill(expert_tokens_.begin(), expert_tokens_.end(), 0);
  std::fill(expert_dropped_.begin(), expert_dropped_.end(), 0);
}

const Routing* Transformer::routing(int64_t layer, int slot) const {
  if (layer < 0 || layer >= config_.n_layer || !layers_[size_t(layer)].moe) return nullptr;
  if (size_t(slot) >= slots_.size() || !slots_[size_t(slot)]) return nullptr;
  const Routing& r = slots_[size_t(slot)]->layer[size_t(layer)].routing;
  return r.expert_begin.empty() ? nullptr : &r;
}

const Tensor& Transformer::logits() const {
  LATTICE_CHECK(!slots_.empty() && slots_[0], "logits() before any forward()");
  LATTICE_CHECK(tp_.size() == 1, "logits() of a tensor-parallel rank hold a vocabulary slice");
  return slots_[0]->logits;
}

std::vector<float> Transformer::logits_row(int64_t row) {
  LATTICE_CHECK(!slots_.empty() && slots_[0] && row >= 0 && row < slots_[0]->N,
                "logits_row({}) without a forward of that many rows", row);
  const Tensor& logits = slots_[0]->logits;
  const int64_t W = logits.dim(1), V = config_.vocab_size;
  std::vector<float> full(static_cast<size_t>(W * tp_.size()));
  Tensor gathered = Tensor::borrow(full.data(), {int64_t(full.size())}, DType::kF32);
  tp_.all_gather_rows(gathered, logits.slice_rows(row, row + 1).view({W}), "logits row (sample)");
  // Rank r holds classes [r·W, r·W + valid_r) then its padding; only the last ranks pad, so
  // the first V gathered entries are the classes in order.
  full.resize(size_t(V));
  return full;
}

void Transformer::set_recompute(Recompute recompute) {
  recompute_ = recompute;
  slots_.clear();
  scratch_.reset();
}

void Transformer::set_context_parallel(bool on) {
  if (on == cp_on_) return;
  cp_on_ = on;
  slots_.clear();
  scratch_.reset();
}

void Transformer::set_sequence_parallel(bool on) {
  if (on == tp_.sequence_parallel()) return;
  tp_ = TensorParallel(tp_.group(), on);
  slots_.clear();
  scratch_.reset();
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
                      L.down.weight, L.down.bias, L.router.weight});
  for (const std::vector<Linear>* maps : {&L.expert_gate, &L.expert_up, &L.expert_down}) {
    for (const Linear& map : *maps) report_grads_ready({map.weight});
  }
  for (const Linear& q : L.qkv) report_grads_ready({q.weight, q.bias});
}

// Backward mirrors forward: the gradient of an all-gather is a reduce-scatter and the other way
// round; the gradient of an all-reduce after a row-parallel map is nothing (every rank already
// holds the whole gradient), and the input gradient of a column-parallel map is a partial sum.
void Transformer::backward_chunk(int chunk, int slot, float loss_scale, bool defer_weights) {
  LATTICE_CHECK(!defer_weights || recompute_ == Recompute::kNone,
                "deferred weight gradients need the activations kept (recompute none)");
  LATTICE_CHECK(
      chunk >= 0 && chunk < chunk_count() && size_t(slot) < slots_.size() && slots_[size_t(slot)],
      "backward of chunk {} slot {} before its forward", chunk, slot);
  LATTICE_CHECK(!defer_weights || !config_.moe(),
                "deferred weight gradients (zero-bubble schedules) are not built for "
                "mixture-of-experts layers");
  Activations& a = *slots_[size_t(slot)];
  Scratch& w = scratch(a.B, a.T);
  backward_loss_scale_ = loss_scale;
  const LayerChunk& part = registry_.part().chunks[size_t(chunk)];
  const ModelConfig& c = config_;
  const ParameterStore& s = store_;
  const bool sp = tp_.sequence_parallel() && tp_.size() > 1;
  const int64_t N = a.N;
  ParameterHooks* hooks = parameter_hooks_;
  if (hooks != nullptr && (part.embedding || part.head)) {
    hooks->before_backward(ParameterHooks::kEnds);
  }

  if (part.head) {
    LATTICE_CHECK(a.have_targets, "backward() needs a forward() with targets first");
    // Loss -> logits: in fp32 written in place of the logits (they are not needed afterwards);
    // in a lower compute dtype straight into the GEMMs' operand, so no cast pass follows.
    Tensor dlogits = compute_dtype_ != DType::kF32 ? w.dlogits : a.logits;
    if (a.vocab_loss) {
      a.vocab_loss->backward(dlogits, a.logits, a.targets.view({N}),
                             {registry_.vocab_start(), registry_.vocab_valid()}, loss_scale);
    } else {
      cross_entropy_backward(dlogits, a.logits, a.targets.view({N}), loss_scale, kIgnoreIndex,
                             a.loss_stats);
    }
    report_progress();
    // Output head: logits = lnf · Wᵀ, W (W, C).
    {
      const KernelTimer timer("gemm lm_head dx", gemm_flops(w.dln_full, dlogits),
                              double(w.dln_full.nbytes() + dlogits.nbytes()));
      matmul(w.dln_full, dlogits, s.compute(lm_head_), Tensor(), {});
    }
    report_progress();
    Tensor dhead = s.grad(lm_head_);
    {
      const KernelTimer timer("gemm lm_head dw",
                              2.0 * double(dhead.numel()) * double(dlogits.shape()[0]),
                              double(dhead.nbytes() + dlogits.nbytes() + a.lnf_full.nbytes()));
      matmul(dhead, dlogits, a.lnf_full, Tensor(), {.transpose_a = true, .accumulate = true});
    }
    report_progress();
    if (lm_head_ != wte_) report_grads_ready({lm_head_});  // tied: final after the embeddings
    if (sp) {
      tp_.reduce_scatter_rows(w.dln, w.dln_full, "ln_f (bwd)");
    } else {
      tp_.all_reduce(w.dln_full, "ln_f (bwd)");
    }
    w.dresidual.zero_();
    norm_backward(c, s, Norm{lnf_w_, lnf_b_}, w.dresidual, w.dln,
                  a.residual[size_t(part.last_layer)], a.lnf_mean, a.lnf_rstd);
    report_grads_ready({lnf_w_, lnf_b_});
  } else {
    w.dresidual.copy_from(a.output_grad[size_t(chunk)]);
  }

  for (int64_t l = part.last_layer - 1; l >= part.first_layer; --l) {
    if (hooks != nullptr) hooks->before_backward(l);
    layer_backward(a, w, l, defer_weights);
    if (hooks != nullptr) hooks->after_backward(l);
    report_progress();
  }

  if (!part.embedding) {
    a.input_grad[size_t(chunk)].copy_from(w.dresidual);
    return;
  }
  // Embeddings: each rank scatters into the rows of its vocabulary slice.
  if (sp) tp_.all_gather_rows(w.dresidual_full, w.dresidual, "embedding (bwd)");
  Tensor dwte = s.grad(wte_);
  embedding_backward(dwte, w.dresidual_full, a.tokens.view({N}), registry_.vocab_start());
  if (c.position == PositionKind::kLearned) position_grads(w.dresidual, a.first_row, a.T);
  report_grads_ready({wte_, wpe_});
  if (hooks != nullptr) hooks->after_backward(ParameterHooks::kEnds);
}

void Transformer::backward_weight_chunk(int chunk, int slot) {
  LATTICE_CHECK(
      chunk >= 0 && chunk < chunk_count() && size_t(slot) < slots_.size() && slots_[size_t(slot)],
      "weight gradients of chunk {} slot {} before its backward", chunk, slot);
  Activations& a = *slots_[size_t(slot)];
  const LayerChunk& part = registry_.part().chunks[size_t(chunk)];
  for (int64_t l = part.last_layer - 1; l >= part.first_layer; --l) {
    layer_backward_weights(a, l);
    report_progress();
  }
}

void Transformer::layer_backward_weights(Activations& a, int64_t l) {
  const ParameterStore& s = store_;
  const Layer& L = layers_[size_t(l)];
  Activations::PerLayer& p = a.layer[size_t(l)];
  LATTICE_CHECK(size_t(l) < a.deferred.size() && a.deferred[size_t(l)].dy_mlp.defined(),
                "layer {} has no deferred weight gradients", l);
  Activations::WeightGradInputs& d = a.deferred[size_t(l)];
  const int64_t N = a.N, Q = registry_.heads().q_heads * config_.head_size();
  linear_backward_weight(s, L.down, d.dy_mlp, p.act, false);
  if (config_.mlp == MlpKind::kGelu) {
    linear_backward_weight(s, L.up, d.dup, p.ln2_full);
  } else {
    linear_backward_weight(s, L.gate, d.dgate, p.ln2_full);
    linear_backward_weight(s, L.up, d.dup, p.ln2_full);
  }
  linear_backward_weight(s, L.out, d.dy_attn, p.att.view({N, Q}), false);
  if (L.qkv.size() == 1) {
    linear_backward_weight(s, L.qkv[0], d.dqkv, p.ln1_full);
  } else {
    linear_backward_weight(s, L.qkv[0], d.dq, p.ln1_full);
    linear_backward_weight(s, L.qkv[1], d.dk, p.ln1_full);
    linear_backward_weight(s, L.qkv[2], d.dv, p.ln1_full);
  }
}

void Transformer::layer_backward(Activations& a, Scratch& w, int64_t l, bool defer_weights) {
  const ModelConfig& c = config_;
  const ParameterStore& s = store_;
  const bool sp = tp_.sequence_parallel() && tp_.size() > 1;
  const int64_t N = a.N, HS = c.head_size();
  const int64_t Q = registry_.heads().q_heads * HS, K = registry_.heads().kv_heads * HS;
  const Layer& L = layers_[size_t(l)];
  Activations::PerLayer& p = a.layer[size_t(l)];
  // Full recompute: the layer's forward again from its kept input, the same collectives
  // included, so that every buffer below holds what the original forward left there.
  if (recompute_ == Recompute::kFull) {
    recomputing_ = true;
    layer_forward(a, w, l);
    recomputing_ = false;
  }
  // The partial gradient of a norm's output (N, C) becomes this rank's rows of the sum.
  auto reduce_dln = [&](std::string what) {
    if (sp) {
      tp_.reduce_scatter_rows(w.dln, w.dln_full, what);
    } else {
      tp_.all_reduce(w.dln_full, what);
    }
  };
  // The gradient of the residual stream as a matmul operand, gathered to all N rows.
  auto gather_dy = [&](std::string what) {
    copy_unless_alias(w.dy, w.dresidual);
    if (sp) tp_.all_gather_rows(w.dy_full, w.dy, what);
  };

  // MLP block. dresidual holds d(layer output) = d(mid) before norm2's contribution.
  gather_dy(fmt::format("layer {} mlp out (bwd)", l));
  if (L.down.bias >= 0) {
    Tensor db = s.grad(L.down.bias);
    bias_backward(db, w.dy);
  }
  // With deferred weights the output gradients of the linear maps are kept for the weight pass.
  Activations::WeightGradInputs* keep = nullptr;
  if (defer_weights) {
    if (a.deferred.size() != size_t(config_.n_layer)) a.deferred.resize(size_t(config_.n_layer));
    keep = &a.deferred[size_t(l)];
    if (!keep->dy_mlp.defined()) {
      auto like = [&](const Tensor& t) {
        return Tensor::empty(arena_, t.shape(), t.dtype(), MemoryCategory::kActivations);
      };
      keep->dy_mlp = like(w.dy_full);
      keep->dup = like(w.dup);
      if (c.mlp == MlpKind::kSwiglu) keep->dgate = like(w.dgate);
      keep->dy_attn = like(w.dy_full);
      if (L.qkv.size() == 1) {
        keep->dqkv = like(w.dqkv);
      } else {
        keep->dq = Tensor::empty(arena_, {N, Q}, w.dq.dtype(), MemoryCategory::kActivations);
        keep->dk = Tensor::empty(arena_, {N, K}, w.dk.dtype(), MemoryCategory::kActivations);
        keep->dv = Tensor::empty(arena_, {N, K}, w.dv.dtype(), MemoryCategory::kActivations);
      }
    }
  }
  // dx of a linear map now; its dW now, or later from the kept dy.
  auto backward_linear = [&](const Linear& lin, Tensor& dx, bool accumulate, const Tensor& dy,
                             const Tensor& x, bool bias_grad) {
    linear_backward_input(s, lin, dx, accumulate, dy);
    if (!defer_weights) linear_backward_weight(s, lin, dy, x, bias_grad);
  };

  if (L.moe) {
    moe_backward(a, w, l);
  } else {
    backward_linear(L.down, w.dact, false, w.dy_full, p.act, false);
    if (keep) keep->dy_mlp.copy_from(w.dy_full);
    if (c.mlp == MlpKind::kGelu) {
      gelu_backward(w.dup, w.dact, p.up, /*accumulate=*/false);
      backward_linear(L.up, w.dln_full, false, w.dup, p.ln2_full, true);
    } else {
      swiglu_backward(w.dgate, w.dup, w.dact, p.gate, p.up, /*accumulate=*/false);
      backward_linear(L.gate, w.dln_full, false, w.dgate, p.ln2_full, true);
      backward_linear(L.up, w.dln_full, true, w.dup, p.ln2_full, true);
      if (keep) keep->dgate.copy_from(w.dgate);
    }
    if (keep) keep->dup.copy_from(w.dup);
  }
  reduce_dln(fmt::format("layer {} ln_2 (bwd)", l));
  norm_backward(c, s, L.norm2, w.dresidual, w.dln, p.mid, p.ln2_mean, p.ln2_rstd);

  // Attention block. dresidual now holds d(mid) = d(layer input) before norm1's contribution.
  gather_dy(fmt::format("layer {} attn out (bwd)", l));
  if (L.out.bias >= 0) {
    Tensor db = s.grad(L.out.bias);
    bias_backward(db, w.dy);
  }
  // Selective recompute: the attention core again from the kept q, k, v (or qkv).
  if (recompute_ == Recompute::kSelective) attention(a, l);
  Tensor datt = w.datt.view({N, Q});
  backward_linear(L.out, datt, false, w.dy_full, p.att.view({N, Q}), false);
  if (keep) keep->dy_attn.copy_from(w.dy_full);
  if (attention_reads_qkv()) {
    attention_backward_qkv(w.dqkv, w.datt, p.qkv, p.att, p.lse);
    backward_linear(L.qkv[0], w.dln_full, false, w.dqkv, p.ln1_full, true);
  } else {
    w.dq.zero_();
    w.dk.zero_();
    w.dv.zero_();
    if (context_parallel_on()) {
      cp_.attention_backward(arena_, w.dq, w.dk, w.dv, w.datt, p.q, p.k, p.v, p.att, p.lse,
                             fmt::format("layer {} attention", l));
    } else {
      attention_backward(w.dq, w.dk, w.dv, w.datt, p.q, p.k, p.v, p.att, p.lse);
    }
    Tensor dq = w.dq, dk = w.dk;
    if (c.position == PositionKind::kRope) {
      w.dq_in.zero_();
      w.dk_in.zero_();
      rotate(w.dq_in, w.dq, true);
      rotate(w.dk_in, w.dk, true);
      dq = w.dq_in;
      dk = w.dk_in;
    }
    Tensor dq2 = dq.view({N, Q}), dk2 = dk.view({N, K}), dv2 = w.dv.view({N, K});
    if (L.qkv.size() == 1) {
      concat_last_dim(w.dqkv, {&dq2, &dk2, &dv2});
      backward_linear(L.qkv[0], w.dln_full, false, w.dqkv, p.ln1_full, true);
    } else {
      backward_linear(L.qkv[0], w.dln_full, false, dq2, p.ln1_full, true);
      backward_linear(L.qkv[1], w.dln_full, true, dk2, p.ln1_full, true);
      backward_linear(L.qkv[2], w.dln_full, true, dv2, p.ln1_full, true);
    }
    if (keep && L.qkv.size() == 3) {
      keep->dq.copy_from(dq2);
      keep->dk.copy_from(dk2);
      keep->dv.copy_from(dv2);
    }
  }
  if (keep && L.qkv.size() == 1) keep->dqkv.copy_from(w.dqkv);
  reduce_dln(fmt::format("layer {} ln_1 (bwd)", l));
  norm_backward(c, s, L.norm1, w.dresidual, w.dln, a.residual[size_t(l)], p.ln1_mean, p.ln1_rstd);
  report_layer_grads_ready(L);
}

void Transformer::reduce_partial_grads() {
  if (!partial_grads_.defined() || tp_.size() == 1) return;
  // Packed into one buffer: one collective instead of one per norm and bias. The held gradient
  // range is the same on every rank of the tp group (same flat layout, same dp rank), so under
  // ZeRO-2/3 each group packs the same pieces: the parts of the partial gradients it owns.
  const FlatRange held = store_.grad_range();
  float* grads = store_.grads().data<float>();
  float* packed = partial_grads_.data<float>();
  int64_t packed_count = 0;
  auto for_each_partial = [&](auto&& fn) {
    int64_t at = 0;
    for (const ParameterSpec& spec : registry_.specs()) {
      if (!spec.partial_grad) continue;
      const int64_t begin = std::max(spec.offset, held.begin);
      const int64_t end = std::min(spec.offset + spec.local_shape.numel(), held.end);
      if (begin >= end) continue;
      fn(grads + (begin - held.begin), packed + at, end - begin);
      at += end - begin;
    }
    packed_count = at;
  };
  for_each_partial([](float* grad, float* pack, int64_t n) { std::copy(grad, grad + n, pack); });
  if (packed_count == 0) return;  // this dp rank owns none of them (as do its tp peers)
  Tensor used = partial_grads_.slice_rows(0, packed_count);
  tp_.all_reduce(used, "replicated parameters' gradients");
  for_each_partial([](float* grad, float* pack, int64_t n) { std::copy(pack, pack + n, grad); });
}

}  // namespace lattice
