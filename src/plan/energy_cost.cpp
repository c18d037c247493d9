#include "plan/energy_cost.h"

#include <cmath>

#include "core/error.h"

namespace lattice::plan {

RunCost estimate_run_cost(const TrainingSetup& setup, const TimeBreakdown& time) {
  const PowerSpec& power = setup.cluster.power;
  const double devices = double(setup.devices);
  const double nodes =
      std::ceil(devices / double(std::max<int64_t>(setup.cluster.gpus_per_node, 1)));
  const double busy =
      std::min(time.step, time.forward + time.backward + time.recompute + time.optimizer);
  RunCost cost;
  cost.busy_fraction = time.step > 0 ? busy / time.step : 0;
  cost.tokens_per_step = double(setup.global_batch) * double(setup.seq_len);
  const double device_joules =
      power.busy_watts * busy + power.waiting_watts * std::max(0.0, time.step - busy);
  cost.joules_per_step =
      power.pue * (devices * device_joules + nodes * power.node_other_watts * time.step);
  const double kwh_per_step = cost.joules_per_step / 3.6e6;
  const double per_million = cost.tokens_per_step > 0 ? 1e6 / cost.tokens_per_step : 0;
  cost.kwh_per_million_tokens = kwh_per_step * per_million;
  cost.money_per_step = devices * time.step / 3600.0 * setup.cluster.price.per_device_hour +
                        kwh_per_step * setup.cluster.price.per_kwh;
  cost.money_per_million_tokens = cost.money_per_step * per_million;
  return cost;
}

Objective parse_objective(std::string_view name) {
  if (name == "time") return Objective::kTime;
  if (name == "cost") return Objective::kCost;
  if (name == "energy") return Objective::kEnergy;
  LATTICE_THROW(ConfigError,
                "unknown objective '{}' ---> HINT: --optimize time (the fastest), cost (money "
                "per token: needs --price-gpu-hour or --price-kwh) or energy (kWh per token)",
                name);
}

std::string_view objective_name(Objective objective) {
  switch (objective) {
    case Objective::kTime:
      return "time";
    case Objective::kCost:
      return "cost";
    case Objective::kEnergy:
      return "energy";
  }
  return "?";
}

double objective_per_token(Objective objective, const TrainingSetup& setup,
                           const TimeBreakdown& time) {
  if (objective == Objective::kTime) {
    return time.tokens_per_second > 0 ? 1.0 / time.tokens_per_second : INFINITY;
  }
  const RunCost cost = estimate_run_cost(setup, time);
  return objective == Objective::kCost ? cost.money_per_million_tokens
                                       : cost.kwh_per_million_tokens;
}

}  // namespace lattice::plan
