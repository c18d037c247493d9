// The token-file reader (data/token_file.h) on a hostile file: opened as a file (it maps it),
// then every token read, and the vocabulary check the loader runs when the data is opened.
#include <cstdlib>

#include "data/token_file.h"
#include "fuzz/fuzz_target.h"

LATTICE_FUZZ_TARGET(token_file) {
  const lattice::TokenFile file(lattice::fuzz::write_input_file(input, "input.bin"));
  uint64_t sum = 0;
  for (const uint16_t token : file.tokens()) sum += token;
  const int64_t first = file.find_token_at_least(65);
  if (first >= file.size()) std::abort();
  if (file.find_token_at_least(lattice::kTokenFileMaxVocab) != -1) std::abort();  // uint16
  if (sum == 0 && first != -1) std::abort();
}
