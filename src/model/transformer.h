// The transformer, forward and backward on one rank, llm.c style: the activations of one
// micro-batch live in buffers allocated once; forward() fills them, backward() walks them in
// reverse and accumulates parameter gradients (+=) into the store.
//
// Tensor parallelism (Megatron-LM, docs/tensor-parallel.md): with a TensorParallel group of n
// ranks each rank holds its shard of the parameters (model/parameters.h) and computes its
// attention heads, its part of the MLP's hidden features and its slice of the vocabulary;
// the collectives between them are explicit in forward() and backward() and go through the
// group (parallel/tensor_parallel.h). Under sequence parallelism the residual stream and the
// norms hold only this rank's token rows.
//
// Context parallelism (parallel/context_parallel.h): with a cp group of n ranks a micro-batch's
// tokens are this rank's two chunks of each sequence (T / n positions); attention is the ring
// over the group, positions (RoPE, learned) are the chunks' global ones; nothing else changes.
//
// Pipeline parallelism: a rank may hold only some layers (a ModelPart of one or more chunks).
// forward_chunk()/backward_chunk() run one chunk for one micro-batch; each micro-batch in
// flight keeps its activations in its own slot, so a schedule can run several forwards before
// their backwards (1F1B, interleaved). The whole-model forward()/backward() are chunk 0, slot 0.
//
// Mixture of experts (model.n_experts > 0, docs/moe.md): each layer's MLP is a router and
// n_experts SwiGLU (or GELU) experts; a token's rows are dispatched to its top-k experts as
// packed rows (model/moe_router.h), the experts run on their rows, and the outputs are combined
// weighted by the gates. Under tensor parallelism each expert is split as the dense MLP is.
//
// Mixed precision (compute dtype bf16): matmul operands (normalised activations, q/k/v, the MLP
// hidden state, the weights' compute copy) are bf16; the residual stream, norm statistics,
// logits, losses and every parameter gradient are f32. With compute dtype f32 all is f32.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/arena.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/moe_router.h"
#include "model/parameter_hooks.h"
#include "model/parameters.h"
#include "parallel/context_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel.h"
#include "parallel/vocab_parallel_cross_entropy.h"

namespace lattice {

// Activation recompute (Recompute, spec/model_kinds.h): what a layer keeps from its forward for
// its backward.
//   none:      everything (fastest, most memory);
//   selective: all but the attention core's output and softmax statistics, recomputed from
//              q, k, v before the layer's backward (Korthikanti et al. 2022);
//   full:      only the layer's input; the whole layer forward runs again before its backward,
//              collectives included, into buffers shared by all layers and micro-batches.

struct ForwardResult {
  double loss_sum = 0.0;    // sum of token losses of the micro-batch
  int64_t token_count = 0;  // targets that count (not ignored)
  // Mixture of experts: the routers' losses of the chunk's layers (model/moe_router.h), a sum
  // to be divided by the global token count like loss_sum; trained on, reported apart.
  double router_loss_sum = 0.0;
};

class Transformer {
 public:
  // tp: this rank's tensor-parallel group (default: none). ConfigError before anything is
  // allocated when the model does not split over it.
  // part: the layers this rank holds (default: all of them).
  // zero: what the parameter store holds under ZeRO (model/parameters.h ParameterStore).
  // cp: this rank's context-parallel group (default: none, whole sequences).
  // ep: this rank's expert-parallel group (default: none, every expert held here).
  Transformer(ModelConfig config, Arena& arena, DType compute_dtype, TensorParallel tp = {},
              const ModelPart& part = {}, ZeroSharding zero = {}, ContextParallel cp = {},
              ExpertParallel ep = {});
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParameterRegistry& registry() const { return registry_; }
  ParameterStore& parameters() { return store_; }
  DType compute_dtype() const { return compute_dtype_; }
  TensorParallel& tensor_parallel() { return tp_; }
  ContextParallel& context_parallel() { return cp_; }
  ExpertParallel& expert_parallel() { return ep_; }
  // Switches context parallelism (inference: every rank runs whole sequences). Activations are
  // rebuilt on the next forward.
  void set_context_parallel(bool on);
  bool context_parallel_on() const { return cp_on_ && cp_.size() > 1; }
  // Frees the activations; the next forward allocates what `recompute` keeps.
  void set_recompute(Recompute recompute);
  Recompute recompute() const { return recompute_; }

  void initialize(uint64_t seed) { store_.initialize(config_, seed); }

  // tokens, targets: i32 (B, T), T <= seq_len. targets may be undefined (inference: logits only).
  // The whole model (a part of one chunk with the embedding and the head).
  ForwardResult forward(const Tensor& tokens, const Tensor& targets);

  // ---- pipeline chunks ----
  // Forward of local chunk `chunk` for the micro-batch in activation slot `slot`. tokens (B, T)
  // give the shape and, for the embedding chunk, the ids; targets are used by the head chunk
  // (loss_sum and token_count are 0 elsewhere). Both must stay alive until backward_chunk. A
  // chunk without the embedding reads its input from chunk_input(chunk, slot).
  ForwardResult forward_chunk(int chunk, int slot, const Tensor& tokens, const Tensor& targets);
  // Backward of the same (chunk, slot): the head chunk starts from the loss (scaled), the others
  // from chunk_output_grad(chunk, slot); a chunk without the embedding leaves the gradient of its
  // input in chunk_input_grad(chunk, slot).
  // defer_weights (zero-bubble schedules): only the input gradients now; the layers' weight
  // gradients later, in backward_weight_chunk() of the same (chunk, slot).
  void backward_chunk(int chunk, int slot, float loss_scale, bool defer_weights = false);
  void backward_weight_chunk(int chunk, int slot);
  // (R, C) f32 buffers of a slot, R = this rank's token rows: where a received activation or
  // gradient goes and where the one to send is. Valid after the slot's first use with (B, T).
  Tensor& chunk_input(int chunk, int slot, int64_t B, int64_t T);
  const Tensor& chunk_output(int chunk, int slot) const;
  Tensor& chunk_output_grad(int chunk, int slot, int64_t B, int64_t T);
  const Tensor& chunk_input_grad(int chunk, int slot) const;
  int chunk_count() const { return int(registry_.part().chunks.size()); }
  // Mixture of experts: the tokens each expert of each layer received (choices kept) and the
  // choices a capacity dropped, since the last reset_expert_counts(): (L × E), zero for layers
  // this rank does not hold; a full recompute's second forward is not counted.
  const std::vector<int64_t>& expert_tokens() const { return expert_tokens_; }
  const std::vector<int64_t>& expert_dropped() const { return expert_dropped_; }
  void reset_expert_counts();
  // Mixture of experts: how the last forward in activation `slot` routed layer `layer`'s tokens
  // (nullptr for a dense or not held layer, or before any forward).
  const Routing* routing(int64_t layer, int slot = 0) const;
  // Logits of the last forward: f32 (B·T, V). Only without tensor parallelism (a tp rank holds
  // a vocabulary slice).
  const Tensor& logits() const;
  // Row `row` of the last forward's logits, all V of them: under tensor parallelism gathered
  // from the vocabulary slices of the group (collective). For sampling.
  std::vector<float> logits_row(int64_t row);
  // Switches sequence parallelism (the shards do not depend on it): inference runs with it off,
  // so that any sequence length works. Activations are rebuilt on the next forward.
  void set_sequence_parallel(bool on);
  // Gradients of loss = Σ token losses · loss_scale, accumulated into parameters().grads().
  // Requires the last forward to have had targets.
  void backward(float loss_scale);
  // Sums the gradients that are partial over the tensor-parallel group (ParameterSpec::
  // partial_grad). Call once per step, after the last micro-batch's backward (and under ZeRO-2/3
  // after the data-parallel reduction: it sums the held gradient range). Collective.
  void reduce_partial_grads();

  // Called by backward() with the index of each parameter as soon as its gradient is final for
  // that backward, every parameter exactly once, in the same order on every rank: data-parallel
  // buckets launch their reduction on it while backward goes on. Empty (the default): none.
  using GradReadyHook = std::function<void(int param_index)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_hook_ = std::move(hook); }
  // Told around every use of a layer's (or the ends') parameters (model/parameter_hooks.h);
  // borrowed; nullptr (the default): the store holds everything.
  void set_parameter_hooks(ParameterHooks* hooks) { parameter_hooks_ = hooks; }

 private:
  struct Layer;
  struct Activations;
  struct Scratch;
  struct Sizes;
  Sizes sizes(int64_t B, int64_t T) const;
  Tensor activation_buffer(Shape shape, DType dtype) const;
  Tensor gathered_rows(const Tensor& rows, Shape full) const;
  Activations& slot_activations(int slot, int64_t B, int64_t T);
  Scratch& scratch(int64_t B, int64_t T);
  // Returns the layer's router losses (0 for a dense layer).
  double layer_forward(Activations& a, Scratch& w, int64_t l);
  // The sparse MLP of a mixture-of-experts layer: w.proj_full = Σ gate · expert(ln2_full) per
  // token (partial over tp, like the dense MLP's output); returns the router losses.
  double moe_forward(Activations& a, Scratch& w, int64_t l);
  // Sends each packed row of `l`'s routing to the rank of its expert (the rows stay here without
  // expert parallelism) and lays out the received blocks; returns the rows received.
  int64_t exchange_to_experts(Activations& a, int64_t l);
  // From w.dy_full to w.dln_full (the partial gradient of ln2_full) and the router's and the
  // experts' weight gradients.
  void moe_backward(Activations& a, Scratch& w, int64_t l);
  void layer_backward(Activations& a, Scratch& w, int64_t l, bool defer_weights);
  void layer_backward_weights(Activations& a, int64_t l);
  void report_grads_ready(std::initializer_list<int> params) const;
  void report_layer_grads_ready(const Layer& layer) const;
  // Learned positions added to (or their gradient taken from) this rank's token rows.
  void add_positions(Tensor& rows, int64_t first_row, int64_t T) const;
  void position_grads(const Tensor& drows, int64_t first_row, int64_t T) const;
  // RoPE at the positions' global offsets (forward: out = rope(in); backward: din += rope⁻¹).
  void rotate(Tensor& out, const Tensor& in, bool backward) const;
  // q, k and v stay in GPT-2's fused projection output, where attention reads them (and its
  // backward writes their gradient), unless RoPE rotates them or the ring of context
  // parallelism passes k and v around: then they are split into buffers of their own.
  // model/model_description.cpp and plan/lattice_activations.cpp count the buffers by this rule.
  bool attention_reads_qkv() const;
  // Causal attention over the whole sequence of layer l's activations into p.att and p.lse: the
  // kernel, or the ring under context parallelism.
  void attention(Activations& a, int64_t l);

  ModelConfig config_;
  Arena& arena_;
  DType compute_dtype_;
  TensorParallel tp_;
  ContextParallel cp_;
  ExpertParallel ep_;
  bool cp_on_ = true;
  Recompute recompute_ = Recompute::kNone;
  float backward_loss_scale_ = 1.0f;  // of the backward in progress (the router losses')
  bool recomputing_ = false;          // a full recompute's forward runs inside backward
  std::vector<int64_t> expert_tokens_, expert_dropped_;  // (L × E)
  ParameterRegistry registry_;
  ParameterStore store_;
  std::vector<Layer> layers_;  // (L), the held ones filled in
  std::vector<std::unique_ptr<Activations>> slots_;
  std::unique_ptr<Scratch> scratch_;
  Tensor partial_grads_;  // packed gradients of the partial_grad parameters (f32)
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, lm_head_ = -1;
  GradReadyHook grad_ready_hook_;
  ParameterHooks* parameter_hooks_ = nullptr;
};

}  // namespace lattice
