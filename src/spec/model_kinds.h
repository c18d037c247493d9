// The switches of the one transformer (model/config.h) that the planner prices too
// (plan/model_spec.h): one enum each, one spelling each, parsed in one place.
#pragma once

#include <string_view>

namespace lattice {

enum class ModelFamily { kGpt2, kLlama };  // decides parameter names (Hugging Face conventions)
enum class NormKind { kLayerNorm, kRmsNorm };
enum class PositionKind { kLearned, kRope };
enum class MlpKind { kGelu, kSwiglu };
// What the backward recomputes: nothing, the attention core (Korthikanti et al.'s selective
// recompute), or each whole layer from its stored input.
enum class Recompute { kNone, kSelective, kFull };

std::string_view family_name(ModelFamily family);      // "gpt2", "llama"
std::string_view norm_name(NormKind kind);             // "layernorm", "rmsnorm"
std::string_view position_name(PositionKind kind);     // "learned", "rope"
std::string_view mlp_name(MlpKind kind);               // "gelu", "swiglu"
std::string_view recompute_name(Recompute recompute);  // "none", "selective", "full"
// ConfigError naming the key (model.family, ...) and the choices.
ModelFamily parse_family(std::string_view text);
NormKind parse_norm(std::string_view text);
PositionKind parse_position(std::string_view text);
MlpKind parse_mlp(std::string_view text);
Recompute parse_recompute(std::string_view name);

}  // namespace lattice
