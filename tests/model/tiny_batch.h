// The fixed (2, 6) token batch the whole-model finite-difference tests score, over `vocab`.
#pragma once

#include <cstdint>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"

namespace lattice::testing {

struct TinyBatch {
  std::vector<int32_t> tokens, targets;
  Tensor tokens_t() { return Tensor::borrow(tokens.data(), {2, 6}, DType::kI32); }
  Tensor targets_t() { return Tensor::borrow(targets.data(), {2, 6}, DType::kI32); }
};

inline TinyBatch make_tiny_batch(int64_t vocab) {
  TinyBatch b;
  PhiloxStream rng(3, 4);
  for (int i = 0; i < 12; ++i) {
    b.tokens.push_back(int32_t(rng.next_below(uint64_t(vocab))));
    b.targets.push_back(int32_t(rng.next_below(uint64_t(vocab))));
  }
  return b;
}

}  // namespace lattice::testing
