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
int64_t cross_entropy_forward(Tensor& losses, const Tensor& logits, const Tensor& targets,
                              int32_t ignore_index = kIgnoreIndex);
// dlogits (N, V) = (softmax(logits) - onehot(targets)) · scale, zero rows for ignored targets.
// Writes (does not accumulate); dlogits may alias logits (then with the same dtype). For a loss
// that is the mean over the global batch, scale = 1 / (non-ignored tokens of the global batch).
void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                            float scale, int32_t ignore_index = kIgnoreIndex);

}  // namespace lattice
