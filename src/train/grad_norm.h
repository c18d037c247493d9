// The global gradient norm and clipping.
//
// The norm is over all gradients of the model — never a per-rank or per-shard norm. On one rank
// that is the norm of the flat gradient buffer; under sharding each rank sums the squares of
// what it counts (its dp shard; split parameters once, tp-replicated ones on tp rank 0, a tied
// copy on the stage of the original) and the sums are reduced before the square root.
#pragma once

#include "comm/communicator.h"
#include "core/tensor.h"
#include "data_parallel/gradient_sync.h"

namespace lattice {

// The norm of the whole model's gradients, as the step clips by it: after the dp
// synchronisation (`dp` counts each element on one rank of its group), over the tp and pp
// groups (nullptr or a group of one: not split that way). Collective over all three groups:
// every rank of the model calls it, and all get the same value. A probe can call it between
// backward and update.
// ep: the expert-parallel group, whose ranks hold different experts (nullptr: none).
double global_grad_norm(ParameterStore& store, GradientSync& dp, Communicator* tp, Communicator* pp,
                        Communicator* ep = nullptr);

// Σ g² of the rank's gradients (accumulated in double).
double grad_sum_squares(const Tensor& grads);
// The factor clipping scales the gradients by: max_norm / norm when norm > max_norm, else 1
// (max_norm <= 0: no clipping). The optimizer applies it as it reads them (AdamW::step).
float clip_factor(double norm, float max_norm);

}  // namespace lattice
