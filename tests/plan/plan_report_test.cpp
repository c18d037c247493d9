#include "plan/plan_report.h"

#include <gtest/gtest.h>

#include <string>

#include "plan_test_setups.h"

namespace lattice::plan {
namespace {

PlanOutcome plan_for(TrainingSetup setup, const SearchConstraints& constraints = {}) {
  PlanOutcome o;
  o.setup = std::move(setup);
  o.search = search_layouts(o.setup, constraints);
  if (!o.search.ranked.empty()) {
    o.alternatives = explain_alternatives(o.setup, o.search.ranked.front());
  }
  return o;
}

TEST(PlanReport, JsonCarriesTheRankingBreakdownsAndReasons) {
  const PlanOutcome o = plan_for(testing::setup_for("gpt2-350m", "dgx-a100", 16, 256, 1024));
  const nlohmann::json j = to_json(o);
  EXPECT_EQ(j["search"]["evaluated"].get<int64_t>(), o.search.evaluated);
  ASSERT_EQ(j["ranked"].size(), o.search.ranked.size());
  const nlohmann::json& best = j["ranked"][0];
  EXPECT_EQ(best["layout"]["dp"].get<int64_t>(), o.search.ranked[0].layout.dp);
  EXPECT_DOUBLE_EQ(best["memory"]["total_bytes"].get<double>(), o.search.ranked[0].memory.total);
  EXPECT_DOUBLE_EQ(best["time"]["step_s"].get<double>(), o.search.ranked[0].time.step);
  ASSERT_EQ(j["alternatives"].size(), o.alternatives.size());
  EXPECT_EQ(j["alternatives"][0]["verdict"].get<std::string>(), o.alternatives[0].verdict);
}

TEST(PlanReport, TextShowsEveryComponentAndTheAlternatives) {
  const PlanOutcome o = plan_for(testing::llama70b_on_1024_h100());
  const std::string text = format_report(o);
  for (const char* expected :
       {"recommended: ", "parameters", "gradients", "optimizer states", "activations",
        "logits and loss", "communication buffers", "fragmentation allowance", "tp collectives",
        "pipeline bubble", "dp traffic", "MFU", "why not:", "rejected (memory)",
        "software profile (not named): gradient reduction hidden behind up to 80%"}) {
    EXPECT_NE(text.find(expected), std::string::npos) << expected << "\n" << text;
  }
}

TEST(PlanReport, NothingFitsShowsWhy) {
  SearchConstraints c;
  c.tp = 8, c.pp = 8, c.dp = 1, c.micro_batch = 1, c.virtual_stages = 16;
  const PlanOutcome o = plan_for(testing::setup_for("llama-3-70b", "dgx-h100", 64, 64, 4096), c);
  const std::string text = format_report(o);
  EXPECT_NE(text.find("no layout fits"), std::string::npos) << text;
  EXPECT_NE(text.find("only 80 layers"), std::string::npos) << text;
  EXPECT_EQ(to_json(o)["first_rejected"]["rejection"]["reason"], "divisibility");
}

}  // namespace
}  // namespace lattice::plan
