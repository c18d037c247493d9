// The parameter registry and the flat parameter store.
//
// Every parameter has one global name (Hugging Face conventions of its family), one global shape
// and an initialiser; its values are a pure function of (seed, name, element index) through the
// counter-based RNG, so any shard of it can be initialised alone (DESIGN.md invariant 1).
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
};

class ParameterRegistry {
 public:
  explicit ParameterRegistry(const ModelConfig& config);

  const std::vector<ParameterSpec>& specs() const { return specs_; }
  int64_t total_elements() const { return total_; }
  // Index of a parameter by global name, or -1.
  int find(std::string_view name) const;
  const ParameterSpec& at(int index) const { return specs_.at(size_t(index)); }

 private:
  int add(std::string name, Shape shape, ParamInit init, bool weight_decay);

  std::vector<ParameterSpec> specs_;
  int64_t total_ = 0;
};

// Fills `out` with elements [first, first + count) of a parameter's initial values.
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

  // Views with the parameter's shape.
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
