// Causal multi-head attention with grouped-query heads, computed in tiles (flash-attention
// style, Dao et al. 2022): the T×T score matrix is never materialised; the forward keeps a
// running max and sum per query row and saves the log-sum-exp; the backward recomputes the
// probabilities of each tile from q, k and the saved log-sum-exp.
//
// q: (B, T, NH, HS); k, v: (B, T, NKV, HS), NH % NKV == 0, query head h reads kv head
// h / (NH / NKV). Scale 1/√HS. Position i attends to positions 0..i.
#pragma once

#include "core/tensor.h"

namespace lattice {

// out (B, T, NH, HS), q's dtype; lse (B, NH, T) f32.
void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v);
// dq +=, dk +=, dv += (f32 or the dtype of q/k/v).
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);

}  // namespace lattice
