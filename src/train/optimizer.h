// AdamW over the flat parameter store: fp32 moments in the same layout as the parameters,
// decoupled weight decay on matrices and embeddings only (ParameterSpec::weight_decay).
//
// Sharded (ZeRO-1/2): the optimizer owns elements [shard_begin, shard_end) of the flat store
// only; its moments hold just that range, and step() updates just that range of the master
// weights (and compute copy). The caller gathers the other ranks' shards afterwards.
#pragma once

#include <cstdint>

#include "core/arena.h"
#include "kernels/adamw.h"
#include "model/parameters.h"

namespace lattice {

class AdamW {
 public:
  // shard_end < 0: the whole store (no sharding).
  AdamW(ParameterStore& store, Arena& arena, AdamWHyper hyper, int64_t shard_begin = 0,
        int64_t shard_end = -1);

  // One update with learning rate `lr` from grad_scale · store.grads() over the owned range
  // (grad_scale: the clip factor; the gradients themselves are left as they are); refreshes the
  // compute copy of that range.
  void step(float lr, float grad_scale = 1.0f);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t step) { step_ = step; }
  Tensor& m() { return m_; }  // first moments, f32 (shard_end - shard_begin)
  Tensor& v() { return v_; }  // second moments, f32 (shard_end - shard_begin)
  const AdamWHyper& hyper() const { return hyper_; }
  ParameterStore& store() { return store_; }
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }
  bool sharded() const {
    return shard_begin_ != 0 || shard_end_ != store_.registry().total_elements();
  }

 private:
  ParameterStore& store_;
  AdamWHyper hyper_;
  int64_t shard_begin_ = 0, shard_end_ = 0;
  Tensor m_, v_;
  int64_t step_ = 0;
};

}  // namespace lattice
