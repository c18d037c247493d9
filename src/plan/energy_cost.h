// What a step costs besides time: the energy the devices and their nodes draw, and money from
// the cluster's prices (ClusterSpec::power, ::price); and the objective a search ranks by.
#pragma once

#include <string_view>

#include "plan/evaluation.h"
#include "plan/training_setup.h"

namespace lattice::plan {

struct RunCost {
  double busy_fraction = 0;  // of the step a device computes (forward, backward, recompute, update)
  double joules_per_step = 0;  // every device and node, times the PUE
  double kwh_per_million_tokens = 0;
  double money_per_step = 0;  // 0 when the cluster has no prices
  double money_per_million_tokens = 0;
  double tokens_per_step = 0;
};

// The step's energy: per device busy_watts while it computes and waiting_watts the rest of the
// step; per node node_other_watts all along; all times the PUE. Money: device-hours at
// per_device_hour plus kWh at per_kwh.
RunCost estimate_run_cost(const TrainingSetup& setup, const TimeBreakdown& time);

// What the search minimises per token: seconds (the fastest, the default), money or energy.
enum class Objective { kTime, kCost, kEnergy };
Objective parse_objective(std::string_view name);  // ConfigError naming the choices
std::string_view objective_name(Objective objective);
// The quantity `objective` ranks by for one evaluated layout, per token; lower is better.
double objective_per_token(Objective objective, const TrainingSetup& setup,
                           const TimeBreakdown& time);

}  // namespace lattice::plan
