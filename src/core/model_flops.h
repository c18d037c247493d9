// Model FLOPs per trained token, the one formula behind every MFU Lattice reports (`lattice
// train`, `lattice bench train`, the planner): PaLM appendix B (Chowdhery et al. 2022), 6·N for
// the weights (forward 2·N, backward 4·N) plus 12·L·C·T for attention's scores and their use
// over the full T×T product. Causal masking's halving is not subtracted: this is PaLM's (and
// Megatron's) convention, so Lattice's MFU compares with theirs.
#pragma once

#include <cstdint>

namespace lattice {

inline double model_flops_per_token(int64_t parameters, int64_t layers, int64_t d_model,
                                    int64_t seq) {
  return 6.0 * double(parameters) + 12.0 * double(layers) * double(d_model) * double(seq);
}

}  // namespace lattice
