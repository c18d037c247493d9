// `lattice doctor --run DIR`: a finished or running run's per-rank metrics
// (<DIR>/metrics/rank_NNNNN.jsonl, run/rank_metrics.h) read back and checked: losses and grad
// norms that left the finite numbers or spiked, stragglers, memory that grows every step or
// fragments, and communication the steps did not hide.
#pragma once

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "doctor/check.h"
#include "run/rank_metrics.h"

namespace lattice::doctor {

// run-loss, run-stragglers, run-memory, run-comm.
std::vector<CheckResult> check_run(const RunMetrics& run);

}  // namespace lattice::doctor
