// LayerNorm and RMSNorm over the last dimension C of an (N, C) input; an input with more
// dimensions, e.g. (B, T, C), is N = B·T rows, and its statistics are (N) or (B, T).
// weight and bias may be f32 or bf16 (the compute copy); their gradients are f32.
#pragma once

#include "core/tensor.h"

namespace lattice {

// out (N, C) = (inp - mean) * rstd * weight + bias; mean, rstd: f32 (N), saved for backward.
// bias may be undefined (models without biases).
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
// dinp (N, C) +=, dweight (C) f32 +=, dbias (C) f32 += (skipped when undefined).
void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd);

// out (N, C) = inp * rstd * weight, rstd = 1 / sqrt(mean(inp²) + eps): f32 (N).
void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                     float eps = 1e-5f);
void rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd);

}  // namespace lattice
