#include "train/optimizer.h"

namespace lattice {

AdamW::AdamW(ParameterStore& store, Arena& arena, AdamWHyper hyper) : store_(store), hyper_(hyper) {
  const Shape shape = store.master().shape();
  m_ = Tensor::zeros(arena, shape, DType::kF32, MemoryCategory::kOptimizerState);
  v_ = Tensor::zeros(arena, shape, DType::kF32, MemoryCategory::kOptimizerState);
}

void AdamW::step(float lr) {
  ++step_;
  const bool separate_copy = store_.compute_dtype() != DType::kF32;
  const auto& specs = store_.registry().specs();
  for (int i = 0; i < int(specs.size()); ++i) {
    const ParameterSpec& spec = specs[size_t(i)];
    const int64_t begin = spec.offset, end = spec.offset + spec.shape.numel();
    AdamWHyper h = hyper_;
    h.lr = lr;
    if (!spec.weight_decay) h.weight_decay = 0.0f;
    Tensor param = store_.master().slice_rows(begin, end);
    Tensor m = m_.slice_rows(begin, end);
    Tensor v = v_.slice_rows(begin, end);
    Tensor copy = separate_copy ? store_.compute().slice_rows(begin, end) : Tensor();
    adamw_update(param, store_.grads().slice_rows(begin, end), m, v, h, step_, copy);
  }
}

}  // namespace lattice
