// Token and position embeddings.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace lattice {

// out (N, C) = table[ids[n] - vocab_start] for ids inside [vocab_start, vocab_start + rows);
// rows for ids outside that range are written as zeros. The range lets a rank that holds only a
// slice of the vocabulary (vocab-parallel embedding) look up its part. ids: i32 (N), or any
// shape such as (B, T); table (rows, C) f32 or bf16; out: ids' shape + (C), f32 or bf16.
void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table,
                       int64_t vocab_start = 0);
// dtable (rows, C) f32 += scatter of dout (N, C) by ids, same range rule.
void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& ids,
                        int64_t vocab_start = 0);

// Learned positions: out (B, T, C) += wpe[position_offset + t] (wpe (maxT, C)).
void position_embedding_forward(Tensor& out, const Tensor& wpe, int64_t position_offset = 0);
// dwpe (maxT, C) f32 += sum over B of dout (B, T, C) at rows position_offset + t.
void position_embedding_backward(Tensor& dwpe, const Tensor& dout, int64_t position_offset = 0);

}  // namespace lattice
