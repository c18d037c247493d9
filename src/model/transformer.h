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
#include "model/parameters.h"
#include "parallel/tensor_parallel.h"
#include "parallel/vocab_parallel_cross_entropy.h"

namespace lattice {

struct ForwardResult {
  double loss_sum = 0.0;    // sum of token losses of the micro-batch
  int64_t token_count = 0;  // targets that count (not ignored)
};

class Transformer {
 public:
  // tp: this rank's tensor-parallel group (default: none). ConfigError before anything is
  // allocated when the model does not split over it.
  Transformer(ModelConfig config, Arena& arena, DType compute_dtype, TensorParallel tp = {});
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParameterRegistry& registry() const { return registry_; }
  ParameterStore& parameters() { return store_; }
  DType compute_dtype() const { return compute_dtype_; }
  TensorParallel& tensor_parallel() { return tp_; }

  void initialize(uint64_t seed) { store_.initialize(config_, seed); }

  // tokens, targets: i32 (B, T), T <= seq_len. targets may be undefined (inference: logits only).
  ForwardResult forward(const Tensor& tokens, const Tensor& targets);
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
  // partial_grad). Call once per step, after the last micro-batch's backward. Collective.
  void reduce_partial_grads();

  // Called by backward() with the index of each parameter as soon as its gradient is final for
  // that backward, every parameter exactly once, in the same order on every rank: data-parallel
  // buckets launch their reduction on it while backward goes on. Empty (the default): none.
  using GradReadyHook = std::function<void(int param_index)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_hook_ = std::move(hook); }

 private:
  struct Layer;
  struct Activations;
  void ensure_activations(int64_t B, int64_t T);
  void report_grads_ready(std::initializer_list<int> params) const;
  void report_layer_grads_ready(const Layer& layer) const;
  // Learned positions added to (or their gradient taken from) this rank's token rows.
  void add_positions(Tensor& rows, int64_t first_row, int64_t T) const;
  void position_grads(const Tensor& drows, int64_t first_row, int64_t T) const;

  ModelConfig config_;
  Arena& arena_;
  DType compute_dtype_;
  TensorParallel tp_;
  ParameterRegistry registry_;
  ParameterStore store_;
  std::vector<Layer> layers_;
  std::unique_ptr<Activations> acts_;
  Tensor partial_grads_;  // packed gradients of the partial_grad parameters (f32)
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, lm_head_ = -1;
  bool have_targets_ = false;
  GradReadyHook grad_ready_hook_;
};

}  // namespace lattice
