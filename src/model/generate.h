// Autoregressive sampling from a trained model.
#pragma once

#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace lattice {

struct SampleOptions {
  int64_t tokens = 100;      // new tokens to generate
  float temperature = 1.0f;  // 0: greedy (argmax)
  uint64_t seed = 42;        // draws are a pure function of (seed, position)
};

// Returns the prompt followed by the generated tokens. The context fed to the model is the last
// seq_len tokens. The prompt must not be empty.
std::vector<int32_t> generate(Transformer& model, std::vector<int32_t> prompt,
                              const SampleOptions& options);

}  // namespace lattice
