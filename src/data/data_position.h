// Where a token loader is in its stream of windows, saved with each checkpoint so a resumed run
// reads exactly the tokens the uninterrupted run would have read.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string_view>

namespace lattice {

// How the windows of a token file are ordered (token_loader.h documents both).
enum class SamplingMode : uint8_t { kSequential, kShuffled };

std::string_view sampling_mode_name(SamplingMode mode);   // "sequential", "shuffled"
SamplingMode parse_sampling_mode(std::string_view name);  // ConfigError naming the choices

// The next window the loader hands out is window `index` (0-based, in the epoch's order) of
// epoch `epoch`. `mode` and `seed` are kept so that resuming under another sampling setup is
// refused instead of silently reading other tokens.
struct DataPosition {
  SamplingMode mode = SamplingMode::kSequential;
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t index = 0;

  bool operator==(const DataPosition&) const = default;
};

// {"mode": "shuffled", "seed": 1234, "epoch": 2, "index": 96}
nlohmann::json data_position_to_json(const DataPosition& position);
// Throws ConfigError naming the missing or malformed field.
DataPosition data_position_from_json(const nlohmann::json& json);

}  // namespace lattice
