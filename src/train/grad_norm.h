// The global gradient norm and clipping.
//
// The norm is over all gradients of the model — never a per-rank or per-shard norm. On one rank
// that is the norm of the flat gradient buffer; under sharding the caller sums the squares of
// what it owns once (split parameters once, replicated ones once) and reduces the sum before the
// square root: grad_norm_total(local_sum_squares, reduce).
#pragma once

#include "core/tensor.h"

namespace lattice {

// Σ g² of the rank's gradients (accumulated in double).
double grad_sum_squares(const Tensor& grads);
// Scales grads by max_norm / norm when norm > max_norm (max_norm <= 0: no clipping).
// Returns the scale applied (1 when not clipped).
float grad_norm_clip(Tensor& grads, double norm, float max_norm);

}  // namespace lattice
