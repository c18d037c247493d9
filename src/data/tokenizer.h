// Tokenizers: text <-> token ids. The interface is small so that a BPE tokenizer (GPT-2's) can
// sit beside the byte tokenizer later without touching the callers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lattice {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`, each in [0, vocab_size()).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of `tokens`; throws ValueError for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> tokens) const = 0;
  virtual int32_t vocab_size() const = 0;
  // The name used on the command line and in configs ("byte").
  virtual std::string_view name() const = 0;
};

// The tokenizer called `name`; throws ConfigError listing the known names.
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name);

}  // namespace lattice
