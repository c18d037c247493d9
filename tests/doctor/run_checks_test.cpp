// `lattice doctor --run`'s checks on run directories written the way run/rank_metrics.h writes
// them: each condition (a loss that left the finite numbers, a grad-norm spike, a straggling
// rank, live bytes that grow every step, fragmented free space, exposed communication, a stage
// idling far beyond its schedule) names its check; a healthy run passes them all; a torn last line
// is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>

#include "core/error.h"
#include "doctor/run_checks.h"
#include "support/scratch_dir.h"
#include "trace/chrome_trace.h"

namespace lattice::doctor {
namespace {

namespace fs = std::filesystem;

// A record as RankMetrics writes it, with the fields the checks read.
nlohmann::json record(int64_t step, double compute_ms) {
  return {{"step", step},
          {"loss", 4.0 - 0.01 * double(step)},
          {"grad_norm", 1.0},
          {"ms", compute_ms + 2.0},
          {"parts",
           {{"busy_ms", compute_ms + 1.0},
            {"forward_ms", compute_ms / 3},
            {"backward_ms", 2 * compute_ms / 3},
            {"pipeline_compute_ms", 0.0},
            {"optimizer_ms", 0.0},
            {"exposed_comm_ms", 1.0},
            {"pipeline_idle_ms", 0.0}}},
          {"memory", {{"live_bytes", 1000}, {"fragmentation", 0.0}}}};
}

// A run directory of `ranks` ranks and `steps` steps; `edit(rank, record)` changes a record.
fs::path write_run(const std::string& name, int ranks, int steps,
                   const std::function<void(int, nlohmann::json&)>& edit = {}) {
  const fs::path dir = testing::scratch_dir(name);
  fs::create_directories(dir / "metrics");
  for (int rank = 0; rank < ranks; ++rank) {
    std::ofstream out(dir / "metrics" / ("rank_0000" + std::to_string(rank) + ".jsonl"));
    for (int step = 1; step <= steps; ++step) {
      nlohmann::json j = record(step, 30.0);
      if (edit) edit(rank, j);
      out << j.dump() << "\n";
    }
  }
  return dir;
}

Verdict verdict_of(const std::vector<CheckResult>& results, const std::string& id) {
  for (const CheckResult& r : results)
    if (r.id == id) return r.verdict;
  throw std::runtime_error("no check " + id);
}

std::string text(const std::vector<CheckResult>& results) {
  return format_results(results);
}

TEST(RunChecks, AHealthyRunPassesAndATornLastLineIsSkipped) {
  const fs::path dir = write_run("run_healthy", 2, 20);
  std::ofstream(dir / "metrics" / "rank_00001.jsonl", std::ios::app) << "{\"step\": 21, \"lo";
  const RunMetrics run = read_run_metrics(dir);
  ASSERT_EQ(run.records.size(), 2u);
  EXPECT_EQ(run.records[1].size(), 20u);
  for (const CheckResult& r : check_run(run)) {
    // Not a traced pipeline run, a dense model: the bubble and the experts have nothing to judge.
    const bool nothing_to_judge = r.id == "run-bubble" || r.id == "run-experts";
    EXPECT_EQ(r.verdict, nothing_to_judge ? Verdict::kNotApplicable : Verdict::kPass) << text({r});
  }
}

TEST(RunChecks, ANonFiniteLossFailsAndAGradNormSpikeWarnsRunLoss) {
  const auto nan_at = [](int rank, nlohmann::json& j) {
    if (rank == 1 && j["step"] == 12) j["loss"] = std::numeric_limits<double>::quiet_NaN();
  };
  // nlohmann writes NaN as null: the reader sees a non-number.
  std::vector<CheckResult> results =
      check_run(read_run_metrics(write_run("run_nan", 2, 20, nan_at)));
  EXPECT_EQ(verdict_of(results, "run-loss"), Verdict::kFail) << text(results);
  const auto spike_at = [](int, nlohmann::json& j) {
    if (j["step"] == 15) j["grad_norm"] = 40.0;
  };
  results = check_run(read_run_metrics(write_run("run_spike", 2, 20, spike_at)));
  EXPECT_EQ(verdict_of(results, "run-loss"), Verdict::kWarn) << text(results);
  EXPECT_NE(text(results).find("step 15 on rank 0: grad norm 40"), std::string::npos)
      << text(results);
}

TEST(RunChecks, ARankComputingTwiceAsLongForSeveralStepsWarnsRunStragglers) {
  const auto slow = [](int rank, nlohmann::json& j) {
    if (rank == 2 && j["step"] >= 8) j = record(j["step"], 70.0);
  };
  const std::vector<CheckResult> results =
      check_run(read_run_metrics(write_run("run_straggler", 4, 20, slow)));
  EXPECT_EQ(verdict_of(results, "run-stragglers"), Verdict::kWarn) << text(results);
  EXPECT_NE(text(results).find("rank 2 was busy 71.0 ms at step 10"), std::string::npos)
      << text(results);
  // Two slow steps only: not yet a straggler.
  const auto briefly = [](int rank, nlohmann::json& j) {
    if (rank == 2 && (j["step"] == 8 || j["step"] == 9)) j = record(j["step"], 70.0);
  };
  EXPECT_EQ(verdict_of(check_run(read_run_metrics(write_run("run_brief", 4, 20, briefly))),
                       "run-stragglers"),
            Verdict::kPass);
}

TEST(RunChecks, LiveBytesGrowingEveryStepOrFragmentedFreeSpaceWarnRunMemory) {
  const auto leak = [](int rank, nlohmann::json& j) {
    if (rank == 0) j["memory"]["live_bytes"] = 1000 + 64 * j["step"].get<int>();
  };
  std::vector<CheckResult> results =
      check_run(read_run_metrics(write_run("run_leak", 2, 20, leak)));
  EXPECT_EQ(verdict_of(results, "run-memory"), Verdict::kWarn) << text(results);
  const auto fragmented = [](int, nlohmann::json& j) { j["memory"]["fragmentation"] = 0.8; };
  results = check_run(read_run_metrics(write_run("run_fragmented", 2, 5, fragmented)));
  EXPECT_EQ(verdict_of(results, "run-memory"), Verdict::kWarn) << text(results);
}

TEST(RunChecks, StepsWaitingOnCommunicationWarnRunComm) {
  const auto exposed = [](int, nlohmann::json& j) { j["parts"]["exposed_comm_ms"] = 20.0; };
  const std::vector<CheckResult> results =
      check_run(read_run_metrics(write_run("run_exposed", 2, 10, exposed)));
  EXPECT_EQ(verdict_of(results, "run-comm"), Verdict::kWarn) << text(results);
}

// Two sparse layers of four experts; `loads(rank, layer)` gives a record's tokens per expert.
void add_experts(nlohmann::json& j, const std::vector<int64_t>& layer0,
                 const std::vector<int64_t>& layer1) {
  j["router_loss"] = 0.02;
  j["experts"] = {{{"layer", 0}, {"tokens", layer0}, {"dropped", {0, 0, 0, 0}}},
                  {{"layer", 1}, {"tokens", layer1}, {"dropped", {0, 0, 0, 0}}}};
}

TEST(RunChecks, ExpertLoadsPassWhenSpreadAndWarnRunExpertsWhenRoutingCollapses) {
  const auto dense = check_run(read_run_metrics(write_run("run_dense", 1, 5)));
  EXPECT_EQ(verdict_of(dense, "run-experts"), Verdict::kNotApplicable) << text(dense);
  const auto spread = [](int, nlohmann::json& j) {
    add_experts(j, {300, 260, 240, 224}, {250, 256, 262, 256});
  };
  const auto healthy = check_run(read_run_metrics(write_run("run_moe_spread", 2, 12, spread)));
  EXPECT_EQ(verdict_of(healthy, "run-experts"), Verdict::kPass) << text(healthy);
  // Layer 1's expert 3 gets 5 of a mean 256 tokens a step: the router sends everything
  // elsewhere (over the 10 steps of the window and 2 ranks: 100 of a mean 5120).
  const auto collapsed = [](int, nlohmann::json& j) {
    add_experts(j, {300, 260, 240, 224}, {500, 400, 119, 5});
  };
  const auto results = check_run(read_run_metrics(write_run("run_moe_collapse", 2, 12, collapsed)));
  EXPECT_EQ(verdict_of(results, "run-experts"), Verdict::kWarn) << text(results);
  EXPECT_NE(text(results).find("layer 1's expert 3 received 100 tokens, 2.0% of the mean 5120"),
            std::string::npos)
      << text(results);
  EXPECT_NE(text(results).find("model.moe_aux_loss"), std::string::npos) << text(results);
}

TEST(RunChecks, ARankWhoseExpertsTakeFarMoreTokensWarnsRunExperts) {
  const auto skewed = [](int rank, nlohmann::json& j) {
    const int64_t n = rank == 2 ? 800 : 256;
    add_experts(j, {n, n, n, n}, {n, n, n, n});
  };
  const auto results = check_run(read_run_metrics(write_run("run_moe_rank", 3, 12, skewed)));
  EXPECT_EQ(verdict_of(results, "run-experts"), Verdict::kWarn) << text(results);
  EXPECT_NE(text(results).find("rank 2's experts received"), std::string::npos) << text(results);
}

// Under expert parallelism a rank computes what its whole ep group routed to the experts it
// holds: both ranks of an ep 2 group send most tokens to experts 0 and 1, so rank 0 (which holds
// them) computes 5× rank 1's rows, though no expert is starved and both routed the same count.
// The same loads without ep are balanced: each rank computes its own tokens.
TEST(RunChecks, UnderExpertParallelismARankHoldingTheBusyExpertsWarnsRunExperts) {
  const auto skewed = [](int rank, nlohmann::json& j) {
    j["at"] = {{"pp", 0}, {"dp", rank}, {"tp", 0}, {"cp", 0}};
    add_experts(j, {300, 300, 60, 60}, {300, 300, 60, 60});
  };
  const fs::path ep = write_run("run_moe_ep", 2, 12, skewed);
  write_run_info(ep, {{"dp", 2}, {"ep", 2}, {"tp", 1}, {"pp", 1}});
  const auto results = check_run(read_run_metrics(ep));
  EXPECT_EQ(verdict_of(results, "run-experts"), Verdict::kWarn) << text(results);
  EXPECT_NE(text(results).find("rank 0's experts received 24000 tokens"), std::string::npos)
      << text(results);
  const fs::path plain = write_run("run_moe_no_ep", 2, 12, skewed);
  write_run_info(plain, {{"dp", 2}, {"ep", 1}, {"tp", 1}, {"pp", 1}});
  const auto balanced = check_run(read_run_metrics(plain));
  EXPECT_EQ(verdict_of(balanced, "run-experts"), Verdict::kPass) << text(balanced);
}

// A pp 2 run's traces: a step of 100 ms on each rank; rank 0 computes for `rank0_compute_ms`
// of it and idles the rest. The 1F1B schedule of 4 micro-batches leaves each stage 20%.
fs::path write_traced_pipeline_run(const std::string& name, double rank0_compute_ms) {
  const fs::path dir = write_run(name, 2, 3);
  write_run_info(dir, {{"pp", 2},
                       {"dp", 1},
                       {"tp", 1},
                       {"schedule", "1f1b"},
                       {"micro_batches", 4},
                       {"virtual_stages", 1},
                       {"trace", (dir / "trace").string()}});
  fs::create_directories(dir / "trace");
  constexpr int64_t kMs = 1000000;
  for (int rank = 0; rank < 2; ++rank) {
    const int64_t compute = rank == 0 ? int64_t(rank0_compute_ms * kMs) : 80 * kMs;
    const std::vector<TraceEvent> events = {
        {.name = "step", .category = TraceCategory::kStep, .start_ns = 0, .end_ns = 100 * kMs},
        {.name = "forward", .category = TraceCategory::kCompute, .start_ns = 0, .end_ns = compute},
        {.name = "recv",
         .category = TraceCategory::kIdle,
         .start_ns = compute,
         .end_ns = 100 * kMs}};
    write_chrome_trace(dir / "trace" / chrome_trace_file_name(rank), rank, events);
  }
  return dir;
}

TEST(RunChecks, AStageIdlingFarBeyondItsScheduleWarnsRunBubble) {
  std::vector<CheckResult> results =
      check_run(read_run_metrics(write_traced_pipeline_run("run_bubble_ok", 78)));
  EXPECT_EQ(verdict_of(results, "run-bubble"), Verdict::kPass) << text(results);
  results = check_run(read_run_metrics(write_traced_pipeline_run("run_bubble_idle", 30)));
  EXPECT_EQ(verdict_of(results, "run-bubble"), Verdict::kWarn) << text(results);
  const CheckResult& r = *std::find_if(results.begin(), results.end(),
                                       [](const auto& c) { return c.id == "run-bubble"; });
  EXPECT_EQ(r.figures.at("rank"), 0);
  EXPECT_NEAR(r.figures.at("measured_bubble").get<double>(), 0.70, 1e-9);
  EXPECT_NEAR(r.figures.at("schedule_bubble").get<double>(), 0.20, 1e-9);
  EXPECT_NE(r.saw.find("rank 0 (stage 0) idled 70.0%"), std::string::npos) << r.saw;
  // Not a pipeline run, or not traced: nothing to judge.
  results = check_run(read_run_metrics(write_run("run_bubble_dp", 2, 3)));
  EXPECT_EQ(verdict_of(results, "run-bubble"), Verdict::kNotApplicable);
}

TEST(RunChecks, ADirectoryWithoutMetricsIsAnIoErrorNamingTheFix) {
  try {
    read_run_metrics(testing::scratch_dir("run_empty"));
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("output.dir of a lattice train run"), std::string::npos);
  }
}

}  // namespace
}  // namespace lattice::doctor
