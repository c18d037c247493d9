// Rotary position embedding (Su et al. 2021) in the Hugging Face Llama convention: dimension i
// of the first half of a head pairs with dimension i + HS/2 ("rotate_half"), frequency
// theta^(-2i/HS).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace lattice {

// out (B, T, H, HS) = rope(inp) at positions position_offset + t. out may alias inp.
void rope_forward(Tensor& out, const Tensor& inp, float theta, int64_t position_offset = 0);
// dinp (B, T, H, HS) += inverse rotation of dout.
void rope_backward(Tensor& dinp, const Tensor& dout, float theta, int64_t position_offset = 0);

}  // namespace lattice
