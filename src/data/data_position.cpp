#include "data/data_position.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lattice {

std::string_view sampling_mode_name(SamplingMode mode) {
  switch (mode) {
    case SamplingMode::kSequential:
      return "sequential";
    case SamplingMode::kShuffled:
      return "shuffled";
  }
  return "unknown";
}

SamplingMode parse_sampling_mode(std::string_view name) {
  if (name == "sequential") return SamplingMode::kSequential;
  if (name == "shuffled") return SamplingMode::kShuffled;
  LATTICE_THROW(ConfigError, "unknown sampling mode '{}' (choose sequential or shuffled)", name);
}

nlohmann::json data_position_to_json(const DataPosition& position) {
  return nlohmann::json{{"mode", sampling_mode_name(position.mode)},
                        {"seed", position.seed},
                        {"epoch", position.epoch},
                        {"index", position.index}};
}

namespace {

const nlohmann::json& field(const nlohmann::json& json, const char* name) {
  auto it = json.find(name);
  if (it == json.end()) {
    LATTICE_THROW(ConfigError,
                  "data position {} has no '{}' field (expected mode, seed, epoch, "
                  "index)",
                  json.dump(), name);
  }
  return *it;
}

int64_t non_negative(const nlohmann::json& json, const char* name) {
  const nlohmann::json& value = field(json, name);
  if (!value.is_number_integer() || value.get<int64_t>() < 0) {
    LATTICE_THROW(ConfigError, "data position field '{}' is {}, expected an integer >= 0", name,
                  value.dump());
  }
  return value.get<int64_t>();
}

}  // namespace

DataPosition data_position_from_json(const nlohmann::json& json) {
  if (!json.is_object()) {
    LATTICE_THROW(ConfigError, "data position must be a JSON object, got {}", json.dump());
  }
  const nlohmann::json& mode = field(json, "mode");
  if (!mode.is_string()) {
    LATTICE_THROW(ConfigError, "data position field 'mode' is {}, expected a string", mode.dump());
  }
  const nlohmann::json& seed = field(json, "seed");
  if (!seed.is_number_unsigned()) {
    LATTICE_THROW(ConfigError, "data position field 'seed' is {}, expected an integer >= 0",
                  seed.dump());
  }
  DataPosition position;
  position.mode = parse_sampling_mode(mode.get<std::string>());
  position.seed = seed.get<uint64_t>();
  position.epoch = non_negative(json, "epoch");
  position.index = non_negative(json, "index");
  return position;
}

}  // namespace lattice
