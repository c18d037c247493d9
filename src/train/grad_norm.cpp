#include "train/grad_norm.h"

#include "kernels/elementwise.h"

namespace lattice {

double grad_sum_squares(const Tensor& grads) {
  return sum_squares(grads);
}

float grad_norm_clip(Tensor& grads, double norm, float max_norm) {
  if (max_norm <= 0.0f || norm <= double(max_norm)) return 1.0f;
  // 1e-6 as in PyTorch's clip_grad_norm_, so a norm of exactly max_norm is (nearly) untouched.
  float factor = float(double(max_norm) / (norm + 1e-6));
  scale(grads, factor);
  return factor;
}

}  // namespace lattice
