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

// The same attention with q, k and v read in place from a fused projection's output (GPT-2's
// c_attn), no split copies: qkv (B·T, (NH + 2·NKV)·HS) as (B, T, ·), the NH query heads first,
// then the NKV key heads, then the NKV value heads; NH and HS are out's. The backward writes
// dqkv (qkv's shape, f32 or qkv's dtype) whole: every element once, nothing added to.
void attention_forward_qkv(Tensor& out, Tensor& lse, const Tensor& qkv);
void attention_backward_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                            const Tensor& lse);

// Ring attention's blocks (parallel/context_parallel.h): the queries against a block of keys
// that starts `shift` >= 0 positions before the first query (key j is seen by query i when
// j <= i + shift; shift >= TK: every key is seen). k, v: (B, TK, NKV, HS), any TK. out may be f32
// (a partial result, merged with attention_merge); the backward takes the merged out and lse
// of all blocks, so each block's call adds its share of dq, dk and dv.
void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       int64_t shift);
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        int64_t shift);
// Merges the attention of the same queries over another, disjoint block of keys: out (f32) and
// lse become those over both blocks (log-sum-exp weights). An lse of -inf: nothing merged yet.
void attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse);

}  // namespace lattice
