// AdamW over the flat parameter store: fp32 moments in the same layout as the parameters,
// decoupled weight decay on matrices and embeddings only (ParameterSpec::weight_decay).
#pragma once

#include <cstdint>

#include "core/arena.h"
#include "kernels/adamw.h"
#include "model/parameters.h"

namespace lattice {

class AdamW {
 public:
  AdamW(ParameterStore& store, Arena& arena, AdamWHyper hyper);

  // One update with learning rate `lr` from store.grads(); refreshes the compute copy.
  void step(float lr);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t step) { step_ = step; }
  Tensor& m() { return m_; }  // first moments, f32 (P)
  Tensor& v() { return v_; }  // second moments, f32 (P)
  const AdamWHyper& hyper() const { return hyper_; }
  ParameterStore& store() { return store_; }

 private:
  ParameterStore& store_;
  AdamWHyper hyper_;
  Tensor m_, v_;
  int64_t step_ = 0;
};

}  // namespace lattice
