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
#include "parallel/expert_parallel.h"
#include "parallel/shard_spec.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero_shards.h"

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
  // The transformer layer the parameter belongs to; -1: the embedding and the head (final norm,
  // output layer). ZeRO-3 gathers the parameters of one layer at a time.
  int64_t layer = -1;
  // The forward reads it in f32 (norm weights, biases, the token table's lookup, learned
  // positions); matmul weights are read from the compute copy. Under bf16 compute with the master
  // sharded (ZeRO-1/2) every rank keeps an f32 copy of these.
  bool read_as_f32 = false;
  // A mixture-of-experts expert's weight: under expert parallelism held only by the ranks of
  // its expert-parallel position, so reduced over those (DeviceMesh::expert_replicas), not dp.
  bool expert = false;
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
  // The parameters of `part` (default: the whole model) as tensor-parallel rank tp holds them;
  // of a sparse layer's experts only expert-parallel rank ep's share.
  explicit ParameterRegistry(const ModelConfig& config, TensorParallelLayout tp = {},
                             const ModelPart& part = {}, ExpertLayout ep = {});

  const std::vector<ParameterSpec>& specs() const { return specs_; }
  // Elements of this rank's flat store (local shards, alignment padding included).
  int64_t total_elements() const { return total_; }
  // Elements of the parameters held here in their global shapes (tied copies not counted): the
  // parameter count of the whole model for whole_model().
  int64_t global_elements() const;
  const ModelPart& part() const { return part_; }
  const TensorParallelLayout& tensor_parallel() const { return tp_; }
  const ExpertLayout& expert_parallel() const { return ep_; }
  const TensorParallelHeads& heads() const { return heads_; }
  // Rows of the token table (and output head) this rank holds: [start, start + valid), padded
  // locally to the same count on every rank.
  int64_t vocab_start() const { return vocab_start_; }
  int64_t vocab_valid() const { return vocab_valid_; }
  // Index of a parameter by global name, or -1.
  int find(std::string_view name) const;
  // Parameter `index`'s elements of the flat store with the alignment padding after it: the
  // ranges of all parameters, in order, tile [0, total_elements()).
  FlatRange padded_range(int index) const;
  std::vector<FlatRange> padded_ranges() const;
  const ParameterSpec& at(int index) const { return specs_.at(size_t(index)); }

 private:
  int add(std::string name, Shape shape, ParamInit init, bool weight_decay, ShardSpec shard,
          bool partial_grad);

  int64_t adding_layer_ = -1;  // the layer add() files parameters under
  std::vector<ParameterSpec> specs_;
  int64_t total_ = 0;
  TensorParallelLayout tp_;
  ExpertLayout ep_;
  ModelPart part_;
  TensorParallelHeads heads_;
  int64_t vocab_start_ = 0, vocab_valid_ = 0;
};

// Fills `out` with elements [first, first + count) of a parameter's initial (global) values.
void initial_values(const ParameterSpec& spec, const ModelConfig& config, uint64_t seed,
                    int64_t first, int64_t count, float* out);

// Which parts of the flat store a rank holds under ZeRO (parallel/zero_shards.h).
//   stage 0: everything: the f32 master (the model's parameters), the compute copy and the
//      gradients of all P elements.
//   stage 1 (and 2) under bf16 compute: master() holds the owned shard only (the optimizer's
//      range); the bf16 compute copy stays whole, and so does an f32 copy of the parameters the
//      forward reads in f32 (ParameterSpec::read_as_f32), kept equal on every rank by the
//      trainer's gather after each update. Under f32 compute the compute copy is the master, so
//      it stays whole until stage 3.
//   stage 2: grads() holds the owned shard only; each backward writes into bucket buffers lent
//      for it (bind_grad) and reduced into the shard.
//   stage 3: master() holds the owned shard only, and there is no standing compute copy: a
//      layer's values are gathered into buffers lent for its use (bind_values).
// A parameter's views (master(i), compute(i), grad(i)) are valid while bound; using one that is
// not is an error naming the parameter (a missing gather is a bug, not a silent zero).
class ParameterStore {
 public:
  // compute_dtype f32: the compute copy is the master buffer itself; bf16: a rounded copy.
  ParameterStore(const ParameterRegistry& registry, Arena& arena, DType compute_dtype,
                 ZeroSharding zero = {});

  void initialize(const ModelConfig& config, uint64_t seed);
  // Re-rounds the compute copy from the master weights (after an update or a load). Nothing to
  // do under ZeRO-3 (the gather rounds).
  void refresh_compute_copy();
  void zero_grads() { grads_.zero_(); }

  const ParameterRegistry& registry() const { return registry_; }
  const ZeroSharding& zero() const { return zero_; }
  // The flat elements master() and grads() hold: [0, P), or the owned shard (stage 3 / 2+).
  FlatRange master_range() const { return master_range_; }
  FlatRange grad_range() const { return grad_range_; }
  Tensor& master() { return master_; }    // f32 (master_range)
  Tensor& grads() { return grads_; }      // f32 (grad_range)
  Tensor& compute() { return compute_; }  // (P) in the compute dtype; undefined under stage 3
  DType compute_dtype() const { return compute_dtype_; }
  bool gradients_lent() const { return zero_.shards_gradients(); }
  bool values_lent() const { return zero_.shards_parameters(); }
  // The f32 master holds the owned range only (stage 3, or stage 1-2 under bf16 compute).
  bool master_sharded() const { return master_range_.size() != registry_.total_elements(); }
  // Stage 1-2 under bf16: the whole compute copy and the f32 copies are kept on every rank.
  bool replicated_values() const { return master_sharded() && !values_lent(); }
  // replicated_values(): writes parameter `index`'s values (f32, local shape) into the compute
  // copy (rounded) and its f32 copy; the master shard is the caller's (a load, the gather).
  void set_replicated_values(int index, const Tensor& values);
  // Writes parameter `index`'s values (f32, local shape) into whatever this rank holds of it:
  // its master (or the owned part of it), and under replicated_values() its compute and f32
  // copies (a load; the caller refreshes the compute copy of a whole master afterwards).
  void assign(int index, const Tensor& values);
  // replicated_values(): the f32 copy of a read_as_f32 parameter (for the gather to fill).
  Tensor f32_copy(int index) const { return bound(lent_master_, index, "f32 copy"); }

  // Views with the parameter's local shape.
  Tensor master(int index) const;
  Tensor grad(int index) const;
  Tensor compute(int index) const;

  // Stage 2/3: parameter `index`'s gradient lives in `view` (local shape, f32) until unbound.
  void bind_grad(int index, Tensor view);
  void unbind_grad(int index);
  // Stage 3: parameter `index`'s gathered f32 values and their compute-dtype copy (the same
  // tensor under f32 compute) until unbound.
  void bind_values(int index, Tensor master, Tensor compute);
  void unbind_values(int index);

 private:
  Tensor slice(const Tensor& flat, int index) const;
  const Tensor& bound(const std::vector<Tensor>& views, int index, const char* what) const;

  const ParameterRegistry& registry_;
  ZeroSharding zero_;
  DType compute_dtype_;
  FlatRange master_range_, grad_range_;
  Tensor master_;
  Tensor grads_;
  Tensor compute_;
  std::vector<Tensor> lent_grads_;                  // stage 2/3, per parameter
  std::vector<Tensor> lent_master_, lent_compute_;  // stage 3 (and stage 1-2 bf16: f32 copies)
  Tensor f32_copies_;  // stage 1-2 under bf16: the read_as_f32 parameters, packed
};

}  // namespace lattice
