// ModelConfig <-> JSON, for checkpoint manifests.
#pragma once

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace lattice {

nlohmann::json model_config_to_json(const ModelConfig& config);
// Throws IoError naming the missing or malformed field.
ModelConfig model_config_from_json(const nlohmann::json& json);

}  // namespace lattice
