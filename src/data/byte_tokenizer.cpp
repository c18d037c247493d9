#include "data/byte_tokenizer.h"

#include "core/error.h"

namespace lattice {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = int32_t(static_cast<unsigned char>(text[i]));
  return tokens;
}

std::string ByteTokenizer::decode(std::span<const int32_t> tokens) const {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t t = tokens[i];
    if (t < 0 || t >= kVocabSize) {
      LATTICE_THROW(ValueError,
                    "byte tokenizer: token {} at position {} is outside [0, {}) ---> HINT: the "
                    "tokens were made by another tokenizer",
                    t, i, kVocabSize);
    }
    text[i] = static_cast<char>(static_cast<unsigned char>(t));
  }
  return text;
}

}  // namespace lattice
