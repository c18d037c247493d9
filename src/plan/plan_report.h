// `lattice plan`'s output: a human report (breakdowns of memory and time, the ranking, why the
// alternatives lose) and the same content as JSON for machines.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "plan/alternatives.h"
#include "plan/search.h"
#include "plan/training_setup.h"

namespace lattice::plan {

struct PlanOutcome {
  TrainingSetup setup;
  SearchResult search;
  std::vector<Alternative> alternatives;  // for search.ranked.front()
  double search_seconds = 0;
};

std::string format_memory(const MemoryBreakdown& memory);
std::string format_time(const TimeBreakdown& time);
std::string format_report(const PlanOutcome& outcome);

nlohmann::json to_json(const Layout& layout);
nlohmann::json to_json(const MemoryBreakdown& memory);
nlohmann::json to_json(const TimeBreakdown& time);
nlohmann::json to_json(const Evaluation& evaluation);
nlohmann::json to_json(const PlanOutcome& outcome);

}  // namespace lattice::plan
