// `lattice plan`'s output: a human report (breakdowns of memory and time, the ranking, why the
// alternatives lose) and the same content as JSON for machines.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "plan/alternatives.h"
#include "plan/published_runs.h"
#include "plan/search.h"
#include "plan/training_setup.h"

namespace lattice::plan {

struct PlanOutcome {
  TrainingSetup setup;
  SearchResult search;
  std::vector<Alternative> alternatives;  // for search.ranked.front()
  double search_seconds = 0;
  Objective objective = Objective::kTime;
  double token_budget = 0;    // --tokens: the run's length, for its time, energy and cost
  double deadline_hours = 0;  // --deadline: the budget's time limit (0: none)
  int64_t devices_given = 0;  // the devices --nodes/--gpus allowed (under --deadline, perhaps more
                              // than setup.devices, the fewest the best layout needs)
};

// The recommended layout's energy and cost lines (and the budget's, with --tokens).
std::string format_cost(const PlanOutcome& outcome, const TimeBreakdown& time);

// "software profile 'megatron-lm 2022 …': gradient reduction hidden behind up to 0% …": the
// runtime factors a prediction rests on (one curve cannot fit two codebases).
std::string format_software(const RuntimeFactors& runtime);
std::string format_memory(const MemoryBreakdown& memory);
std::string format_time(const TimeBreakdown& time);
std::string format_report(const PlanOutcome& outcome);

nlohmann::json to_json(const Layout& layout);
nlohmann::json to_json(const MemoryBreakdown& memory);
nlohmann::json to_json(const TimeBreakdown& time);
nlohmann::json to_json(const Evaluation& evaluation);
nlohmann::json to_json(const PlanOutcome& outcome);

// `lattice plan --validate-published`: per published run its source, the layout predicted,
// predicted against published step time and utilisation, fit; then the mean and worst error.
std::string format_published(const PublishedValidation& validation);
nlohmann::json to_json(const PublishedValidation& validation);

}  // namespace lattice::plan
