// `lattice data prepare`: a text corpus -> train.bin and val.bin token files (token_file.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace lattice {

struct PrepareOptions {
  std::filesystem::path input;    // the corpus, read as bytes
  std::filesystem::path out_dir;  // created if missing
  std::string tokenizer = "byte";
  // The last val_fraction of the tokens become val.bin, the rest train.bin: nanoGPT's
  // shakespeare_char split (train = first int(n * 0.9)), in [0, 1).
  double val_fraction = 0.1;
};

struct PrepareResult {
  std::filesystem::path train_path;
  std::filesystem::path val_path;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
};

// Tokenizes the whole input and writes out_dir/train.bin and out_dir/val.bin. Throws IoError
// for an unreadable input or unwritable directory, ConfigError for a bad tokenizer name or
// fraction, ValueError if the tokenizer's vocabulary does not fit the uint16 format.
PrepareResult prepare_token_files(const PrepareOptions& options);

// Tokens that go to train.bin out of `total` (the rest go to val.bin): floor(total * (1 - f)).
int64_t train_token_count(int64_t total, double val_fraction);

}  // namespace lattice
