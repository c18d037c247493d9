#include "train/optimizer.h"

#include <algorithm>

namespace lattice {

AdamW::AdamW(ParameterStore& store, Arena& arena, AdamWHyper hyper, int64_t shard_begin,
             int64_t shard_end)
    : store_(store), hyper_(hyper) {
  const int64_t P = store.registry().total_elements();
  shard_begin_ = shard_begin;
  shard_end_ = shard_end < 0 ? P : shard_end;
  LATTICE_CHECK(0 <= shard_begin_ && shard_begin_ <= shard_end_ && shard_end_ <= P,
                "AdamW shard [{}, {}) outside the {} parameters", shard_begin_, shard_end_, P);
  const Shape shape{shard_end_ - shard_begin_};
  m_ = Tensor::zeros(arena, shape, DType::kF32, MemoryCategory::kOptimizerState);
  v_ = Tensor::zeros(arena, shape, DType::kF32, MemoryCategory::kOptimizerState);
}

void AdamW::step(float lr, float grad_scale) {
  ++step_;
  // Under ZeRO-3 there is no standing compute copy (the gathers round it).
  const bool separate_copy = store_.compute_dtype() != DType::kF32 && store_.compute().defined();
  // The store's master and gradient buffers hold these ranges of the flat layout.
  const FlatRange master = store_.master_range(), grads = store_.grad_range();
  const auto& specs = store_.registry().specs();
  for (int i = 0; i < int(specs.size()); ++i) {
    const ParameterSpec& spec = specs[size_t(i)];
    // The part of this parameter inside the owned range (AdamW is elementwise).
    const int64_t begin = std::max(spec.offset, shard_begin_);
    const int64_t end = std::min(spec.offset + spec.local_shape.numel(), shard_end_);
    if (begin >= end) continue;
    AdamWHyper h = hyper_;
    h.lr = lr;
    h.grad_scale = grad_scale;
    if (!spec.weight_decay) h.weight_decay = 0.0f;
    Tensor param = store_.master().slice_rows(begin - master.begin, end - master.begin);
    Tensor m = m_.slice_rows(begin - shard_begin_, end - shard_begin_);
    Tensor v = v_.slice_rows(begin - shard_begin_, end - shard_begin_);
    Tensor copy = separate_copy ? store_.compute().slice_rows(begin, end) : Tensor();
    Tensor grad = store_.grads().slice_rows(begin - grads.begin, end - grads.begin);
    adamw_update(param, grad, m, v, h, step_, copy);
  }
}

}  // namespace lattice
