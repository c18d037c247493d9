// The planner's energy and cost (plan/energy_cost.h): a step's joules from the time breakdown
// and the cluster's power, money from its prices, and a search ranked by either.
#include "plan/energy_cost.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "plan/search.h"
#include "plan_test_setups.h"

namespace lattice::plan {
namespace {

using testing::setup_for;

// 16 H100 (2 nodes), a 10 s step of which 6 s compute: devices 700 W × 6 s + 175 W × 4 s,
// nodes 4600 W × 10 s, PUE 1.2.
TEST(EnergyCost, AStepsEnergyAndMoneyFollowFromItsTimeAndTheClustersPowerAndPrices) {
  TrainingSetup s = setup_for("llama-3-8b", "dgx-h100", 16, 64, 4096);
  s.cluster.power.pue = 1.2;
  s.cluster.price = {.per_device_hour = 2.0, .per_kwh = 0.10};
  TimeBreakdown t;
  t.forward = 2, t.backward = 3.5, t.recompute = 0.25, t.optimizer = 0.25;
  t.tp_communication = 1, t.bubble = 2, t.dp_communication = 1;
  t.step = 10;
  const RunCost c = estimate_run_cost(s, t);
  EXPECT_DOUBLE_EQ(c.busy_fraction, 0.6);
  const double joules = 1.2 * (16 * (700 * 6.0 + 175 * 4.0) + 2 * 4600 * 10.0);
  EXPECT_DOUBLE_EQ(c.joules_per_step, joules);
  EXPECT_DOUBLE_EQ(c.tokens_per_step, 64.0 * 4096);
  const double kwh = joules / 3.6e6;
  EXPECT_DOUBLE_EQ(c.kwh_per_million_tokens, kwh * 1e6 / (64.0 * 4096));
  EXPECT_DOUBLE_EQ(c.money_per_step, 16 * 10 / 3600.0 * 2.0 + kwh * 0.10);
  EXPECT_DOUBLE_EQ(c.money_per_million_tokens, c.money_per_step * 1e6 / (64.0 * 4096));
  // No prices: no money.
  s.cluster.price = {};
  EXPECT_EQ(estimate_run_cost(s, t).money_per_step, 0.0);
}

TEST(EnergyCost, AnUnknownObjectiveNamesTheChoices) {
  EXPECT_EQ(parse_objective("energy"), Objective::kEnergy);
  try {
    parse_objective("speed");
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("time"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("energy"), std::string::npos) << e.what();
  }
}

// Ranked by energy, the list is in increasing kWh per token (it is by tokens/s by default),
// and a waiting device that draws as much as a busy one makes energy follow time exactly.
TEST(EnergyCost, ASearchByEnergyRanksByKwhPerToken) {
  TrainingSetup s = setup_for("llama-3-8b", "dgx-h100", 32, 256, 4096);
  SearchConstraints c;
  c.top_k = 8;
  c.objective = Objective::kEnergy;
  const SearchResult by_energy = search_layouts(s, c);
  ASSERT_GE(by_energy.ranked.size(), 2u);
  for (size_t i = 1; i < by_energy.ranked.size(); ++i) {
    EXPECT_LE(objective_per_token(Objective::kEnergy, s, by_energy.ranked[i - 1].time),
              objective_per_token(Objective::kEnergy, s, by_energy.ranked[i].time));
  }
  s.cluster.power.waiting_watts = s.cluster.power.busy_watts;
  c.objective = Objective::kTime;
  const SearchResult by_time = search_layouts(s, c);
  c.objective = Objective::kEnergy;
  const SearchResult flat = search_layouts(s, c);
  ASSERT_EQ(by_time.ranked.size(), flat.ranked.size());
  EXPECT_DOUBLE_EQ(by_time.ranked.front().time.step, flat.ranked.front().time.step);
}

}  // namespace
}  // namespace lattice::plan
