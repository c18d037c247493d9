// One check of `lattice doctor` and what it found (docs/doctor.md): a verdict, what it saw (with
// the numbers), and the fix (a flag, a config key, a command).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lattice::doctor {

enum class Verdict { kPass, kWarn, kFail, kNotApplicable };
std::string_view verdict_name(Verdict verdict);  // PASS, WARN, FAIL, N/A

struct CheckResult {
  std::string id;     // stable, e.g. "timeouts": what --json and the tests key on
  std::string title;  // "Collective timeouts vs the step"
  Verdict verdict = Verdict::kNotApplicable;
  std::string saw;  // what it measured or read, with the numbers; for N/A why it does not apply
  std::string fix;  // empty on PASS and N/A
  nlohmann::json figures = nlohmann::json::object();  // the numbers, machine-readable
};

// The --json form, one object per check: {"id", "title", "verdict", "saw", "fix", "figures"}.
nlohmann::json to_json(const CheckResult& result);
// The text form: one block per check, verdict first.
std::string format_results(const std::vector<CheckResult>& results);
// How many checks failed.
int failed_count(const std::vector<CheckResult>& results);

}  // namespace lattice::doctor
