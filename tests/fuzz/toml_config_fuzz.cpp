// The training config loader (train/train_config.h) on hostile TOML: the input up to its first
// NUL byte is the file, each line after it a `--set` override, as `lattice train` reads them.
// The loaded config then goes through the checks `lattice train` runs before any rank starts.
#include <string>
#include <vector>

#include "fuzz/fuzz_target.h"
#include "train/train_config.h"

LATTICE_FUZZ_TARGET(toml_config) {
  const std::string_view bytes = lattice::fuzz::as_text(input);
  const size_t nul = bytes.find('\0');
  const std::string_view toml_text = bytes.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = bytes.substr(nul + 1);
    while (!rest.empty()) {
      const size_t end = rest.find('\n');
      overrides.emplace_back(rest.substr(0, end));
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    }
  }
  lattice::TrainConfig config = lattice::parse_train_config(toml_text, "fuzz.toml", overrides);
  config.check_timeout_ladder();
  config.resolve_batch(config.parallel.dp);
}
