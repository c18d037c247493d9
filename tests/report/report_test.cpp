// The report page as text: Chart.js inlined (nothing fetched from the network), the run's data
// embedded, text that cannot end a script early, and a clear error without Chart.js.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "report/report.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

RunMetrics two_ranks(int steps) {
  RunMetrics run;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<nlohmann::json>& records = run.records.emplace_back();
    for (int step = 1; step <= steps; ++step) {
      records.push_back({{"step", step},
                         {"rank", rank},
                         {"loss", 4.0 - 0.1 * step},
                         {"lr", 1e-3},
                         {"grad_norm", 1.0},
                         {"ms", 30.0},
                         {"tokens_per_s", 1000.0},
                         {"mfu", 0.2},
                         {"parts", {{"busy_ms", 28.0}}},
                         {"memory", {{"fragmentation", 0.0}, {"live", {{"parameters", 1 << 20}}}}},
                         {"comm",
                          {{{"group", "dp[pp0·tp0]"},
                            {"collective", "all_reduce"},
                            {"busbw", 2e9},
                            {"seconds", 1e-3}}}}});
    }
  }
  return run;
}

TEST(Report, InlinesChartJsAndEmbedsTheRunSoThatItOpensOffline) {
  const std::string html = render_report(two_ranks(5), {.title = "runs/x"});
  EXPECT_NE(html.find("Chart.js v3"), std::string::npos);  // Debian's build, inlined
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
  EXPECT_EQ(html.find("<script src="), std::string::npos);
  const size_t data = html.find("id=\"run-data\">");
  ASSERT_NE(data, std::string::npos);
  const size_t begin = data + std::string("id=\"run-data\">").size();
  const nlohmann::json embedded =
      nlohmann::json::parse(html.substr(begin, html.find("</script>", begin) - begin));
  EXPECT_EQ(embedded.at("ranks").size(), 2u);
  EXPECT_EQ(embedded.at("ranks")[1].at("steps").size(), 5u);
  EXPECT_EQ(embedded.at("bandwidth")[0].at("name"), "dp[pp0·tp0] all_reduce");
  EXPECT_DOUBLE_EQ(embedded.at("bandwidth")[0].at("busbw_gbs")[0].get<double>(), 2.0);
}

TEST(Report, TextThatWouldEndAScriptIsEscaped) {
  RunMetrics run = two_ranks(2);
  run.records[0][0]["comm"][0]["group"] = "</script><b>x";
  const std::string html = render_report(run, {.title = "<i>run</i>"});
  EXPECT_EQ(html.find("</script><b>x"), std::string::npos);
  EXPECT_NE(html.find("&lt;i&gt;run&lt;/i&gt;"), std::string::npos);
}

TEST(Report, ARunStillGoingOrDeadRendersWhatWasWritten) {
  const std::filesystem::path dir = testing::scratch_dir("report_partial");
  std::filesystem::create_directories(dir / "metrics");
  const RunMetrics full = two_ranks(5);
  for (int rank = 0; rank < 2; ++rank) {
    std::ofstream out(dir / "metrics" / ("rank_0000" + std::to_string(rank) + ".jsonl"));
    const int steps = rank == 0 ? 5 : 3;  // rank 1 is behind, or died at step 4
    for (int i = 0; i < steps; ++i) out << full.records[size_t(rank)][size_t(i)].dump() << "\n";
    if (rank == 1) out << "{\"step\": 4, \"loss\"";  // torn by the crash
  }
  const RunMetrics run = read_run_metrics(dir);
  EXPECT_EQ(run.records[1].size(), 3u);
  const std::string html = render_report(run, {.title = dir.string()});
  EXPECT_NE(html.find("2 rank(s), 5 steps"), std::string::npos);
}

TEST(Report, WithoutChartJsTheErrorSaysHowToInstallIt) {
  try {
    render_report(two_ranks(2), {.title = "x", .chart_js = "/nonexistent/chart.min.js"});
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/setup.sh installs libjs-chart.js"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace lattice
