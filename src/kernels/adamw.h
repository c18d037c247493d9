// Fused AdamW (Loshchilov & Hutter 2019): decoupled weight decay, bias-corrected moments,
// fp32 master weights updated from fp32 gradients in one pass.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace lattice {

struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  // Multiplies each gradient as it is read: the clip factor, folded into the update so that
  // clipping costs no pass of its own over the gradients (1: unscaled).
  float grad_scale = 1.0f;
};

// For each element, with g = grad_scale · grad: m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
// p -= lr · (m / (1-β1^step) / (sqrt(v / (1-β2^step)) + eps) + weight_decay · p).
// step counts from 1. param, grad, m, v: f32, same shape. If param_copy is defined (bf16 or
// f32, same shape) it receives the updated parameter rounded to its dtype (the compute copy).
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& hyper,
                  int64_t step, Tensor param_copy = Tensor());

}  // namespace lattice
