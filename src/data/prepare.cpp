#include "data/prepare.h"

#include <cmath>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

namespace lattice {

namespace {

std::string read_corpus(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    LATTICE_THROW(IoError, "cannot read corpus '{}' ---> HINT: check the --input path",
                  path.string());
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) LATTICE_THROW(IoError, "error while reading corpus '{}'", path.string());
  return text;
}

void check_val_fraction(double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    LATTICE_THROW(ConfigError, "validation fraction {} is outside [0, 1)", val_fraction);
  }
}

}  // namespace

int64_t train_token_count(int64_t total, double val_fraction) {
  check_val_fraction(val_fraction);
  // The same arithmetic as nanoGPT's int(n * 0.9), so the splits agree token for token.
  return int64_t(std::floor(double(total) * (1.0 - val_fraction)));
}

PrepareResult prepare_token_files(const PrepareOptions& options) {
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(options.tokenizer);
  if (tokenizer->vocab_size() > kTokenFileMaxVocab) {
    LATTICE_THROW(ValueError,
                  "tokenizer '{}' has {} tokens, more than the token file's uint16 format holds "
                  "({})",
                  tokenizer->name(), tokenizer->vocab_size(), kTokenFileMaxVocab);
  }
  check_val_fraction(options.val_fraction);  // before the corpus is read

  std::vector<int32_t> tokens = tokenizer->encode(read_corpus(options.input));
  const int64_t total = int64_t(tokens.size());
  const int64_t train = train_token_count(total, options.val_fraction);
  if (train == 0) {
    LATTICE_THROW(ValueError, "corpus '{}' has {} tokens: nothing is left for train.bin",
                  options.input.string(), total);
  }

  std::error_code error;
  std::filesystem::create_directories(options.out_dir, error);
  if (error) {
    LATTICE_THROW(IoError, "cannot create output directory '{}': {}", options.out_dir.string(),
                  error.message());
  }
  PrepareResult result;
  result.train_path = options.out_dir / "train.bin";
  result.val_path = options.out_dir / "val.bin";
  result.train_tokens = train;
  result.val_tokens = total - train;
  std::span<const int32_t> all(tokens);
  write_token_file(result.train_path, all.first(size_t(train)));
  write_token_file(result.val_path, all.subspan(size_t(train)));
  return result;
}

}  // namespace lattice
