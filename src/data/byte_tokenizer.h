// The byte tokenizer: one token per byte, token id = byte value (vocab 256). Any file is
// encodable and decode(encode(x)) == x for every byte string.
#pragma once

#include "data/tokenizer.h"

namespace lattice {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kVocabSize = 256;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> tokens) const override;
  int32_t vocab_size() const override { return kVocabSize; }
  std::string_view name() const override { return "byte"; }
};

}  // namespace lattice
