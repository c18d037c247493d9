// Softmax cross-entropy over logits split by vocabulary across the tensor-parallel group
// (Megatron-LM's vocab-parallel cross-entropy): each rank holds the logits of its vocabulary
// slice and the full logits are never gathered. Three small collectives over token rows replace
// a (N, V) gather: the row maximum, then Σ exp(x - max) and the target's logit together.
#pragma once

#include "core/arena.h"
#include "parallel/tensor_parallel.h"

namespace lattice {

struct VocabSlice {
  int64_t start = 0;  // first global class held
  int64_t valid = 0;  // classes held; columns of the local logits beyond them are padding
};

class VocabParallelCrossEntropy {
 public:
  VocabParallelCrossEntropy(Arena& arena, int64_t rows);

  // losses (N) f32; logits (N, Vl) f32 local slice; targets i32 (N) global class ids in
  // [0, vocab_size) or kIgnoreIndex. Returns the number of counted targets. Collective.
  int64_t forward(TensorParallel& tp, Tensor& losses, const Tensor& logits, const Tensor& targets,
                  VocabSlice slice, int64_t vocab_size);
  // dlogits (N, Vl) = (softmax - onehot) · scale on this slice (may alias logits). Local: uses
  // the row statistics of the last forward.
  void backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, VocabSlice slice,
                float scale) const;

 private:
  Tensor row_max_;  // (N) f32
  Tensor sums_;     // (2, N) f32: Σ exp(x - max); target logit
};

}  // namespace lattice
