#include "doctor/check.h"

#include <fmt/format.h>

#include <algorithm>

namespace lattice::doctor {

std::string_view verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::kPass:
      return "PASS";
    case Verdict::kWarn:
      return "WARN";
    case Verdict::kFail:
      return "FAIL";
    case Verdict::kNotApplicable:
      return "N/A";
  }
  return "?";
}

nlohmann::json to_json(const CheckResult& result) {
  return {{"id", result.id},   {"title", result.title}, {"verdict", verdict_name(result.verdict)},
          {"saw", result.saw}, {"fix", result.fix},     {"figures", result.figures}};
}

std::string format_results(const std::vector<CheckResult>& results) {
  std::string text;
  for (const CheckResult& r : results) {
    text +=
        fmt::format("{:<4}  {} ({})\n      {}\n", verdict_name(r.verdict), r.title, r.id, r.saw);
    if (!r.fix.empty()) text += fmt::format("      fix: {}\n", r.fix);
  }
  return text;
}

int failed_count(const std::vector<CheckResult>& results) {
  return int(std::count_if(results.begin(), results.end(),
                           [](const CheckResult& r) { return r.verdict == Verdict::kFail; }));
}

}  // namespace lattice::doctor
