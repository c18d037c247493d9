#include "train/grad_norm.h"

#include <algorithm>
#include <cmath>

#include "kernels/elementwise.h"
#include "parallel/rank_sum.h"

namespace lattice {

double global_grad_norm(ParameterStore& store, GradientSync& dp, Communicator* tp, Communicator* pp,
                        Communicator* ep) {
  // grads() holds [held.begin, held.end) of the flat store: all of it, or the ZeRO-2/3 shard.
  const Tensor& grads = store.grads();
  const FlatRange held = store.grad_range();
  const FlatRange counted = dp.counted_range();
  const bool split_tp = tp != nullptr && tp->size() > 1;
  const bool split_pp = pp != nullptr && pp->size() > 1;
  const bool split_ep = ep != nullptr && ep->size() > 1;
  double local = 0.0, experts = 0.0;
  if (!split_tp && !split_pp && !split_ep) {
    if (counted.size() > 0) {
      local =
          grad_sum_squares(grads.slice_rows(counted.begin - held.begin, counted.end - held.begin));
    }
  } else {
    for (const ParameterSpec& spec : store.registry().specs()) {
      if (spec.shard.replicated() && split_tp && tp->rank() != 0) continue;
      if (spec.tied_copy) continue;  // counted on the first stage
      const int64_t lo = std::max(counted.begin, spec.offset);
      const int64_t hi = std::min(counted.end, spec.offset + spec.local_shape.numel());
      if (lo >= hi) continue;
      // Each rank of an ep group holds other experts: their squares add up over the group.
      (split_ep && spec.expert ? experts : local) +=
          grad_sum_squares(grads.slice_rows(lo - held.begin, hi - held.begin));
    }
  }
  local = dp.sum_counted(local);
  // ZeRO-1 counts each expert element on one of the ranks holding it (sum_counted); then the ep
  // ranks add their different experts.
  if (split_ep) local += sum_over_ranks(*ep, {dp.sum_counted(experts)})[0];
  if (split_tp) local = sum_over_ranks(*tp, {local})[0];
  if (split_pp) local = sum_over_ranks(*pp, {local})[0];
  return std::sqrt(local);
}

double grad_sum_squares(const Tensor& grads) {
  return sum_squares(grads);
}

float clip_factor(double norm, float max_norm) {
  if (max_norm <= 0.0f || norm <= double(max_norm)) return 1.0f;
  // 1e-6 as in PyTorch's clip_grad_norm_, so a norm of exactly max_norm is (nearly) untouched.
  return float(double(max_norm) / (norm + 1e-6));
}

}  // namespace lattice
