// A small deterministic corpus written as train.bin / val.bin into a temporary directory.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "core/philox.h"
#include "data/token_file.h"
#include "support/scratch_dir.h"

namespace lattice::testing {

// Sentences of random words from a small vocabulary: learnable, byte-tokenised.
inline std::vector<int32_t> corpus_tokens(int64_t count, uint64_t seed) {
  static const char* kWords[] = {
      "to",     "be", "or",   "not",    "that",   "is",  "the",    "question", "whether", "tis",
      "nobler", "in", "mind", "suffer", "slings", "and", "arrows", "of",       "fortune"};
  PhiloxStream rng(seed, 77);
  std::vector<int32_t> tokens;
  while (int64_t(tokens.size()) < count) {
    std::string word = kWords[rng.next_below(std::size(kWords))];
    word += rng.next_below(8) == 0 ? ".\n" : " ";
    for (char ch : word) tokens.push_back(int32_t(static_cast<unsigned char>(ch)));
  }
  tokens.resize(size_t(count));
  return tokens;
}

// Creates {train,val}.bin in a fresh scratch directory (support/scratch_dir.h) and returns the
// directory.
inline std::filesystem::path make_corpus_dir(const std::string& name, int64_t train_tokens = 20000,
                                             int64_t val_tokens = 4000) {
  auto dir = scratch_dir("corpus_" + name);
  write_token_file(dir / "train.bin", corpus_tokens(train_tokens, 1));
  write_token_file(dir / "val.bin", corpus_tokens(val_tokens, 2));
  return dir;
}

}  // namespace lattice::testing
