#include "trace/trace_event.h"

#include <array>

namespace lattice {

namespace {

// Indexed by TraceCategory; the order is the enum's.
constexpr std::array<std::string_view, kTraceCategoryCount> kCategoryNames = {
    "compute", "send", "recv", "collective", "idle", "optimizer", "data", "checkpoint", "step"};

}  // namespace

std::string_view trace_category_name(TraceCategory category) {
  return kCategoryNames.at(static_cast<size_t>(category));
}

std::optional<TraceCategory> parse_trace_category(std::string_view name) {
  for (size_t i = 0; i < kCategoryNames.size(); ++i) {
    if (kCategoryNames[i] == name) return static_cast<TraceCategory>(i);
  }
  return std::nullopt;
}

std::optional<int64_t> TraceEvent::int_arg(std::string_view key) const {
  for (const TraceArg& arg : args) {
    if (arg.key != key) continue;
    if (const auto* value = std::get_if<int64_t>(&arg.value)) return *value;
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace lattice
