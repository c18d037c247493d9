#include "run/traced_steps.h"

#include <algorithm>

#include "spec/pipeline_schedule.h"
#include "trace/chrome_trace.h"

namespace lattice {

std::vector<TracedStep> last_traced_steps(const std::filesystem::path& trace_dir,
                                          const RunMetrics& run) {
  const nlohmann::json& info = run.info;
  const int pp = info.value("pp", 1);
  const int per_stage = std::max(1, info.value("dp", 1) * info.value("tp", 1));
  std::optional<BubbleFraction> theory;
  if (pp > 1 && info.contains("schedule")) {
    theory = bubble_fraction(
        simulate(make_schedule(parse_schedule_kind(info.at("schedule").get<std::string>()), pp,
                               info.value("micro_batches", 1), info.value("virtual_stages", 1))));
  }
  std::vector<TracedStep> steps;
  for (int rank = 0; rank < int(run.records.size()); ++rank) {
    const std::filesystem::path file = trace_dir / chrome_trace_file_name(rank);
    if (!std::filesystem::exists(file)) continue;
    const RankTrace trace = read_chrome_trace(file);
    const std::vector<TraceWindow> windows = step_windows(trace.events);
    if (windows.empty()) continue;
    TracedStep step{.rank = rank, .stage = rank / per_stage, .window = windows.back()};
    for (const TraceEvent& e : trace.events) {
      if (e.category == TraceCategory::kStep || e.end_ns <= step.window.start_ns ||
          e.start_ns >= step.window.end_ns) {
        continue;
      }
      step.events.push_back(e);
    }
    step.bubble = summarize_rank_trace(rank, trace.events, step.window).bubble_fraction;
    if (theory && step.stage < int(theory->per_rank.size()))
      step.theory = theory->per_rank[size_t(step.stage)];
    steps.push_back(std::move(step));
  }
  return steps;
}

}  // namespace lattice
