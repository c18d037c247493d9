// Softmax cross-entropy fused with its gradient, never materialising the probabilities.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace lattice {

inline constexpr int32_t kIgnoreIndex = -100;  // as PyTorch's default

// losses (N) f32 = -log softmax(logits[n])[targets[n]]; 0 where targets[n] == ignore_index.
// logits (N, V) f32 or bf16; targets i32 (N). Leading dimensions may also be kept: logits
// (B, T, V), targets and losses (B, T). Every target must lie in [0, V) or equal
// ignore_index (ValueError otherwise). Returns the number of non-ignored targets.
// row_stats, if defined: (2, N) f32 that receives each row's max (row 0) and Σ exp(x - max)
// (row 1), for the backward of the same logits to read instead of two passes of its own.
int64_t cross_entropy_forward(Tensor& losses, const Tensor& logits, const Tensor& targets,
                              int32_t ignore_index = kIgnoreIndex, Tensor row_stats = Tensor());
// dlogits (N, V) f32 or bf16 = (softmax(logits) - onehot(targets)) · scale, zero rows for
// ignored targets. Writes (does not accumulate); dlogits may alias logits (then with the same
// dtype); a bf16 dlogits is the rounded gradient, as a cast of the f32 one would give. For a
// loss that is the mean over the global batch, scale = 1 / (non-ignored tokens of the global
// batch). row_stats, if defined: what cross_entropy_forward wrote for these logits (the same
// bits as recomputing them).
void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                            float scale, int32_t ignore_index = kIgnoreIndex,
                            const Tensor& row_stats = Tensor());

// ---- A slice of the vocabulary (vocab-parallel cross-entropy, parallel/) ----
// logits (N, Vl) f32 hold the global classes [vocab_start, vocab_start + valid) in columns
// [0, valid); columns from `valid` on are padding and never count. The caller combines the
// per-slice statistics over the slices (max, then sums) and gets the same loss as above.

// row_max (N) f32 = max over the valid columns of each row (-inf when valid == 0).
void cross_entropy_slice_max(Tensor& row_max, const Tensor& logits, int64_t valid);
// sums (2, N) f32: row 0 = Σ exp(x - row_max) over the valid columns; row 1 = the target's logit
// when the target lies in this slice, else 0 (also 0 for ignored targets).
void cross_entropy_slice_sums(Tensor& sums, const Tensor& logits, const Tensor& targets,
                              const Tensor& row_max, int64_t vocab_start, int64_t valid,
                              int32_t ignore_index = kIgnoreIndex);
// dlogits (N, Vl) f32 or bf16 = (exp(x - row_max) / row_sum - onehot(target)) · scale on the
// valid columns; 0 on padding columns and on rows with ignored targets. May alias logits (f32).
void cross_entropy_slice_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                                  const Tensor& row_max, const Tensor& row_sum, int64_t vocab_start,
                                  int64_t valid, float scale, int32_t ignore_index = kIgnoreIndex);

}  // namespace lattice
