// The planner's view of a trainer config (forecast/forecast.h): layouts translated both ways
// unchanged, and a run's forecast as metrics/run.json keeps it — one entry per pipeline stage
// equal to the planner's own figures, or the reason the planner cannot price the layout.
#include "forecast/forecast.h"

#include <gtest/gtest.h>

#include "plan/memory_model.h"
#include "plan/time_model.h"

namespace lattice {
namespace {

TrainConfig tiny_config(int dp, int pp, int zero) {
  TrainConfig c;
  c.model = model_preset("gpt2-tiny");
  c.parallel.dp = dp;
  c.parallel.pp = pp;
  c.parallel.zero = zero;
  c.micro_batch = 2;
  c.micro_batches = pp > 1 ? 4 : 1;
  c.seq_len = 32;
  return c;
}

TEST(Forecast, ALayoutTranslatesToThePlannerAndBackUnchanged) {
  TrainConfig c = tiny_config(2, 2, 1);
  c.parallel.tp = 2;
  c.parallel.sequence_parallel = true;
  c.parallel.schedule = ScheduleKind::kInterleaved1F1B;
  c.parallel.virtual_stages = 2;
  c.parallel.recompute = Recompute::kSelective;
  const plan::Layout layout = plan_layout(c);
  EXPECT_EQ(layout.devices(), 8);
  EXPECT_EQ(layout.micro_batch, 2);
  const ParallelConfig back = runtime_layout(layout);
  EXPECT_EQ(back.dp, 2);
  EXPECT_EQ(back.tp, 2);
  EXPECT_EQ(back.pp, 2);
  EXPECT_EQ(back.zero, 1);
  EXPECT_TRUE(back.sequence_parallel);
  EXPECT_EQ(back.schedule, ScheduleKind::kInterleaved1F1B);
  EXPECT_EQ(back.virtual_stages, 2);
  EXPECT_EQ(back.recompute, Recompute::kSelective);
}

TEST(Forecast, EachStageHoldsThePlannersFigures) {
  const TrainConfig c = tiny_config(1, 2, 0);
  const plan::ClusterSpec cluster = plan::cluster_preset("dgx-h100");
  const nlohmann::json forecast = forecast_run(c, cluster, "dgx-h100");
  ASSERT_FALSE(forecast.contains("rejected")) << forecast.dump();
  EXPECT_EQ(forecast.at("cluster"), "dgx-h100");
  TrainConfig resolved = c;
  resolved.resolve_batch(1);
  const plan::Layout layout = plan_layout(resolved);
  const plan::TrainingSetup setup = plan_setup(resolved, layout, cluster);
  EXPECT_EQ(setup.global_batch, 8);
  const plan::TimeBreakdown time = plan::estimate_time(setup, layout);
  EXPECT_DOUBLE_EQ(forecast.at("step_ms").get<double>(), 1e3 * time.step);
  EXPECT_DOUBLE_EQ(forecast.at("parts_ms").at("pipeline_idle").get<double>(),
                   1e3 * (time.bubble + time.pp_communication));
  ASSERT_EQ(forecast.at("stages").size(), 2u);
  for (int stage = 0; stage < 2; ++stage) {
    const plan::MemoryBreakdown m = plan::estimate_stage_memory(setup, layout, stage);
    const nlohmann::json& s = forecast.at("stages")[size_t(stage)];
    EXPECT_EQ(s.at("stage"), stage);
    EXPECT_DOUBLE_EQ(s.at("parameters").get<double>(), m.parameters);
    EXPECT_DOUBLE_EQ(s.at("optimizer states").get<double>(), m.optimizer_states);
    EXPECT_DOUBLE_EQ(s.at("total").get<double>(), m.total - m.fragmentation);
  }
  // The stages split the layers: neither holds the whole model's parameters.
  const double one_rank =
      forecast_run(tiny_config(1, 1, 0), cluster, "dgx-h100").at("stages")[0].at("parameters");
  EXPECT_LT(forecast.at("stages")[0].at("parameters").get<double>(), one_rank);
}

TEST(Forecast, ZeroOneShardsTheOptimizerStateInTheForecast) {
  const plan::ClusterSpec cluster = plan::cluster_preset("dgx-h100");
  const double whole =
      forecast_run(tiny_config(2, 1, 0), cluster, "x").at("stages")[0].at("optimizer states");
  const double sharded =
      forecast_run(tiny_config(2, 1, 1), cluster, "x").at("stages")[0].at("optimizer states");
  EXPECT_NEAR(sharded, whole / 2, 0.01 * whole);
}

TEST(Forecast, AGivenPipelineSplitIsPricedAsSplit) {
  TrainConfig split = tiny_config(1, 2, 0);
  split.parallel.layers_per_chunk = {1, 1};
  const nlohmann::json forecast = forecast_run(split, plan::cluster_preset("dgx-h100"), "dgx-h100");
  ASSERT_FALSE(forecast.contains("rejected")) << forecast.dump();
  ASSERT_EQ(forecast.at("stages").size(), 2u);
  EXPECT_GT(forecast.at("step_ms").get<double>(), 0.0);
  EXPECT_NE(forecast.at("layout").get<std::string>().find("layers=1×2"), std::string::npos)
      << forecast.dump();
}

}  // namespace
}  // namespace lattice
