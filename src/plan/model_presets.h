// Built-in model presets: the published GPT-2/GPT-3/Llama-3 shapes and the repository's own
// tiny presets (the trainer's configs of the same names).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "plan/model_spec.h"

namespace lattice::plan {

// Throws ConfigError listing the known names when `name` is not a preset.
ModelSpec model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// A preset name, or else a path to a model config file (model_file.h).
ModelSpec resolve_model(const std::string& name_or_path);

}  // namespace lattice::plan
