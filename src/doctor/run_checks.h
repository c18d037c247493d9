// `lattice doctor --run DIR`: a finished or running run's per-rank metrics
// (<DIR>/metrics/rank_NNNNN.jsonl, run/rank_metrics.h) read back and checked: losses and grad
// norms that left the finite numbers or spiked, stragglers, memory that grows every step or
// fragments, communication the steps did not hide, and a pipeline's measured bubble against its
// schedule's (from the traces of `lattice train --trace`).
#pragma once

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "doctor/check.h"
#include "run/rank_metrics.h"

namespace lattice::doctor {

// run-loss, run-stragglers, run-memory, run-comm, and run-bubble on the run's traces
// (`trace_dir`; empty: the directory metrics/run.json records, when the run traced).
std::vector<CheckResult> check_run(const RunMetrics& run,
                                   const std::filesystem::path& trace_dir = {});

}  // namespace lattice::doctor
