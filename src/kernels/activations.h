// MLP activations.
#pragma once

#include "core/tensor.h"

namespace lattice {

// GELU, tanh approximation (as GPT-2): out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
void gelu_forward(Tensor& out, const Tensor& inp);
void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp);  // dinp +=

// SwiGLU (Llama MLP): out (N, F) = silu(gate) · up, silu(x) = x·sigmoid(x).
void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up);
void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up);  // dgate +=, dup +=

}  // namespace lattice
