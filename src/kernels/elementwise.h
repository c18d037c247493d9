// Small helpers the model needs between the big kernels.
#pragma once

#include "core/tensor.h"

namespace lattice {

// out = a + b (same shape; out may alias a or b).
void add(Tensor& out, const Tensor& a, const Tensor& b);
// y += alpha · x.
void axpy(Tensor& y, float alpha, const Tensor& x);
// x *= alpha.
void scale(Tensor& x, float alpha);
// Σ x² over all elements, accumulated in double (for gradient norms).
double sum_squares(const Tensor& x);
// out (N, OC) f32 += bias (OC) f32 on every row (a bias added after a reduction).
void bias_forward(Tensor& out, const Tensor& bias);
// dbias (OC) f32 += Σ over rows of dout (N, OC).
void bias_backward(Tensor& dbias, const Tensor& dout);

// Splits inp (N, Σ widths) along the last dimension into outs[i] (N, widths[i]); concat is the
// inverse. Used to cut a fused qkv projection into q, k, v. Dtypes may differ (converted).
void split_last_dim(std::initializer_list<Tensor*> outs, const Tensor& inp);
// out (N, Σ widths) — writes, or accumulates when accumulate is true.
void concat_last_dim(Tensor& out, std::initializer_list<const Tensor*> inps,
                     bool accumulate = false);

}  // namespace lattice
