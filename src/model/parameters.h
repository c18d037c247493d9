// The parameter registry and the flat parameter store.
//
// Every parameter has one global name (Hugging Face conventions of its family), one global shape
// and an initialiser; its values are a pure function of (seed, name, element index) through the
// counter-based RNG, so any shard of it can be initialised alone (DESIGN.md invariant 1).
//
// Under tensor parallelism (Megatron-LM) each rank holds a shard of most parameters: the spec
// records the global shape, the shard of this rank and its local shape; the store holds local
// shards only. A shard's values are the matching slice of the global tensor bit for bit.
//
// The store keeps all parameters of a rank in one contiguous f32 buffer (and gradients in a
// second with the same layout), so the optimizer, the gradient norm and data-parallel reduction
// work on flat ranges; each parameter is a view into it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/tensor.h"
#include "model/config.h"
#include "parallel/shard_spec.h"
#include "parallel/tensor_parallel.h"

namespace lattice {

enum class ParamInit {
  kNormal,          // N(0, init_std)
  kResidualNormal,  // N(0, init_std / sqrt(2·n_layer)): projections into the residual stream
  kZeros,
  kOnes,
};

struct ParameterSpec {
  std::string name;  // global name, e.g. "transformer.h.0.attn.c_attn.weight"
  Shape shape;       // global shape
  ParamInit init = ParamInit::kNormal;
  bool weight_decay = false;  // matrices and embeddings decay; norms and biases do not
  int64_t offset = 0;         // first element in the flat store
  ShardSpec shard;            // this rank's part of the global tensor
  Shape local_shape;          // shape of that part as stored (padding included)
  // The gradient each rank computes is a partial sum over the tensor-parallel group (replicated
  // parameters that see only part of the work: norms and row-parallel biases under sequence
  // parallelism, replicated kv projections): summed over the group once per step.
  bool partial_grad = false;
  // A copy of a parameter that another pipeline stage also holds (the token table, tied to the
  // output head, on the last stage): the copies' gradients are summed over the embedding group
  // so that they stay equal, and the copy is not counted again in the gradient norm.
  bool tied_copy = false;
};

// The layers of one pipeline chunk, [first_layer, last_layer), with the embedding (the model's
// first chunk) and the final norm, output head and loss (its last chunk).
struct LayerChunk {
  int64_t first_layer = 0;
  int64_t last_layer = 0;
  bool embedding = false;
  bool head = false;
};

// What one rank holds of the model: its chunks in rank-local order (v of them when pipeline
// stages are interleaved). whole_model(): one chunk with everything.
struct ModelPart {
  std::vector<LayerChunk> chunks;
  bool holds_layer(int64_t layer) const;
  bool has_embedding() const;
  bool has_head() const;
};
ModelPart whole_model(const ModelConfig& config);

// How attention heads are laid out on the tensor-parallel ranks.
struct TensorParallelHeads {
  int64_t q_heads = 0;         // local query heads
  int64_t q_head_first = 0;    // first global query head
  int64_t kv_heads = 0;        // local key/value heads
  int64_t kv_head_first = 0;   // first global kv head used
  bool kv_replicated = false;  // kv projections replicated (n_kv_head does not divide by tp)
};

// ConfigError, before anything is allocated, when the model cannot be split over `tp` ranks:
// heads, kv heads or d_ff that do not divide.
void validate_tensor_parallel(const ModelConfig& config, const TensorParallelLayout& tp);

class ParameterRegistry {
 public:
  // The parameters of `part` (default: the whole model) as tensor-parallel rank tp holds them.
  explicit ParameterRegistry(const ModelConfig& config, TensorParallelLayout tp = {},
                             const ModelPart& part = {});

  const std::vector<ParameterSpec>& specs() const { return specs_; }
  // Elements of this rank's flat store (local shards, alignment padding included).
  int64_t total_elements() const { return total_; }
  // Elements of the parameters held here in their global shapes (tied copies not counted): the
  // parameter count of the whole model for whole_model().
  int64_t global_elements() const;
  const ModelPart& part() const { return part_; }
  const TensorParallelLayout& tensor_parallel() const { return tp_; }
  const TensorParallelHeads& heads() const { return heads_; }
  // Rows of the token table (and output head) this rank holds: [start, start + valid), padded
  // locally to the same count on every rank.
  int64_t vocab_start() const { return vocab_start_; }
  int64_t vocab_valid() const { return vocab_valid_; }
  // Index of a parameter by global name, or -1.
  int find(std::string_view name) const;
  const ParameterSpec& at(int index) const { return specs_.at(size_t(index)); }

 private:
  int add(std::string name, Shape shape, ParamInit init, bool weight_decay, ShardSpec shard,
          bool partial_grad);

  std::vector<ParameterSpec> specs_;
  int64_t total_ = 0;
  TensorParallelLayout tp_;
  ModelPart part_;
  TensorParallelHeads heads_;
  int64_t vocab_start_ = 0, vocab_valid_ = 0;
};

// Fills `out` with elements [first, first + count) of a parameter's initial (global) values.
void initial_values(const ParameterSpec& spec, const ModelConfig& config, uint64_t seed,
                    int64_t first, int64_t count, float* out);

class ParameterStore {
 public:
  // compute_dtype f32: the compute copy is the master buffer itself; bf16: a rounded copy.
  ParameterStore(const ParameterRegistry& registry, Arena& arena, DType compute_dtype);

  void initialize(const ModelConfig& config, uint64_t seed);
  // Re-rounds the compute copy from the master weights (after an update or a load).
  void refresh_compute_copy();
  void zero_grads() { grads_.zero_(); }

  const ParameterRegistry& registry() const { return registry_; }
  Tensor& master() { return master_; }  // f32 (P)
  Tensor& grads() { return grads_; }    // f32 (P)
  Tensor& compute() { return compute_; }
  DType compute_dtype() const { return compute_.dtype(); }

  // Views with the parameter's local shape.
  Tensor master(int index) const;
  Tensor grad(int index) const;
  Tensor compute(int index) const;

 private:
  Tensor slice(const Tensor& flat, int index) const;

  const ParameterRegistry& registry_;
  Tensor master_;
  Tensor grads_;
  Tensor compute_;
};

}  // namespace lattice
