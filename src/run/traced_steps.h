// The last traced step of every rank of a run (`lattice train --trace DIR`): its events, its
// measured bubble (the trace's summary, trace/trace_summary.h) and, in a pipeline run, the
// bubble the schedule itself leaves its stage (spec/ simulated with unit costs, from the layout
// metrics/run.json records). lattice report draws them; lattice doctor --run judges them.
#pragma once

#include <filesystem>
#include <optional>
#include <vector>

#include "run/rank_metrics.h"
#include "trace/trace_event.h"
#include "trace/trace_summary.h"

namespace lattice {

struct TracedStep {
  int rank = 0;
  int stage = 0;  // the pipeline stage of the rank (world rank ÷ dp·tp)
  TraceWindow window;
  std::vector<TraceEvent> events = {};  // those overlapping the window, step markers left out
  double bubble = 0;                    // the measured share of the window the rank idled
  std::optional<double> theory = {};    // the schedule's bubble for the stage (pipeline runs)
};

// One entry per rank whose trace file under `trace_dir` holds a step; ranks without one are
// left out (a run that died before writing its trace).
std::vector<TracedStep> last_traced_steps(const std::filesystem::path& trace_dir,
                                          const RunMetrics& run);

}  // namespace lattice
