// MLP activations.
#pragma once

#include "core/tensor.h"

namespace lattice {

// GELU, tanh approximation (as GPT-2): out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
void gelu_forward(Tensor& out, const Tensor& inp);
// Backward: dinp += the gradient, or, with accumulate = false, dinp = it (no zeroing pass over
// dinp first; the same bits as adding into zeros).
void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp, bool accumulate = true);

// SwiGLU (Llama MLP): out (N, F) = silu(gate) · up, silu(x) = x·sigmoid(x).
void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up);
// dgate +=, dup += (=, = with accumulate = false, as gelu_backward).
void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up, bool accumulate = true);

}  // namespace lattice
