#include "parallel/vocab_parallel_cross_entropy.h"

#include <cmath>

#include "core/error.h"
#include "kernels/cross_entropy.h"

namespace lattice {

VocabParallelCrossEntropy::VocabParallelCrossEntropy(Arena& arena, int64_t rows)
    : row_max_(Tensor::empty(arena, {rows}, DType::kF32, MemoryCategory::kActivations)),
      sums_(Tensor::empty(arena, {2, rows}, DType::kF32, MemoryCategory::kActivations)) {}

int64_t VocabParallelCrossEntropy::forward(TensorParallel& tp, Tensor& losses, const Tensor& logits,
                                           const Tensor& targets, VocabSlice slice,
                                           int64_t vocab_size) {
  const int64_t rows = targets.numel();
  LATTICE_CHECK(rows == row_max_.numel(), "vocab-parallel cross-entropy built for {} rows, got {}",
                row_max_.numel(), rows);
  const int32_t* t = targets.data<int32_t>();
  int64_t counted = 0;
  for (int64_t n = 0; n < rows; ++n) {
    if (t[n] == kIgnoreIndex) continue;
    if (t[n] < 0 || t[n] >= vocab_size) {
      LATTICE_THROW(ValueError,
                    "vocab-parallel cross-entropy: targets[{}] = {} is outside [0, {}) ---> "
                    "HINT: check the tokenizer's vocabulary size against the model's V",
                    n, t[n], vocab_size);
    }
    ++counted;
  }
  cross_entropy_slice_max(row_max_, logits, slice.valid);
  tp.all_reduce_max(row_max_, "logits row max");
  cross_entropy_slice_sums(sums_, logits, targets, row_max_, slice.start, slice.valid);
  tp.all_reduce(sums_, "logits Σexp and target logit");
  const float* max = row_max_.data<float>();
  const float* sum_exp = sums_.data<float>();
  const float* target_logit = sum_exp + rows;
  float* loss = losses.data<float>();
  for (int64_t n = 0; n < rows; ++n) {
    loss[n] = t[n] == kIgnoreIndex ? 0.0f : std::log(sum_exp[n]) + (max[n] - target_logit[n]);
  }
  return counted;
}

void VocabParallelCrossEntropy::backward(Tensor& dlogits, const Tensor& logits,
                                         const Tensor& targets, VocabSlice slice,
                                         float scale) const {
  Tensor row_sum = sums_.slice_rows(0, 1).view({row_max_.numel()});
  cross_entropy_slice_backward(dlogits, logits, targets, row_max_, row_sum, slice.start,
                               slice.valid, scale);
}

}  // namespace lattice
