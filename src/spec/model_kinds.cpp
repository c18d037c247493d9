#include "spec/model_kinds.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "core/error.h"

namespace lattice {
namespace {

template <class Enum>
Enum parse_choice(std::string_view text, std::string_view what,
                  std::initializer_list<std::pair<std::string_view, Enum>> choices) {
  std::string valid;
  for (const auto& [name, value] : choices) {
    if (name == text) return value;
    valid += valid.empty() ? std::string(name) : ", " + std::string(name);
  }
  LATTICE_THROW(ConfigError, "model.{} = '{}' is not valid ---> HINT: use one of {}", what, text,
                valid);
}

}  // namespace

std::string_view family_name(ModelFamily family) {
  return family == ModelFamily::kGpt2 ? "gpt2" : "llama";
}
std::string_view norm_name(NormKind kind) {
  return kind == NormKind::kLayerNorm ? "layernorm" : "rmsnorm";
}
std::string_view position_name(PositionKind kind) {
  return kind == PositionKind::kLearned ? "learned" : "rope";
}
std::string_view mlp_name(MlpKind kind) {
  return kind == MlpKind::kGelu ? "gelu" : "swiglu";
}

ModelFamily parse_family(std::string_view text) {
  return parse_choice<ModelFamily>(text, "family",
                                   {{"gpt2", ModelFamily::kGpt2}, {"llama", ModelFamily::kLlama}});
}
NormKind parse_norm(std::string_view text) {
  return parse_choice<NormKind>(
      text, "norm", {{"layernorm", NormKind::kLayerNorm}, {"rmsnorm", NormKind::kRmsNorm}});
}
PositionKind parse_position(std::string_view text) {
  return parse_choice<PositionKind>(
      text, "position", {{"learned", PositionKind::kLearned}, {"rope", PositionKind::kRope}});
}
MlpKind parse_mlp(std::string_view text) {
  return parse_choice<MlpKind>(text, "mlp",
                               {{"gelu", MlpKind::kGelu}, {"swiglu", MlpKind::kSwiglu}});
}

std::string_view recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Recompute parse_recompute(std::string_view name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  LATTICE_THROW(ConfigError, "unknown recompute '{}' ---> HINT: use none, selective or full", name);
}

}  // namespace lattice
