#include "data/tokenizer.h"

#include "core/error.h"
#include "data/byte_tokenizer.h"

namespace lattice {

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  LATTICE_THROW(ConfigError, "unknown tokenizer '{}' (known: byte)", name);
}

}  // namespace lattice
