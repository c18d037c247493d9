// `lattice report` through the executable, rendered by headless Chromium offline: every chart
// drawn with data equal to the metrics files, nothing fetched, no script or console error, one
// heatmap row per rank.
#include <gtest/gtest.h>

#include <string>

#include "cli/cli_run.h"
#include "run/rank_metrics.h"
#include "support/scratch_dir.h"
#include "trace/chrome_trace.h"
#include "trace/trace_summary.h"
#include "train/test_corpus.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 120;

TEST(ReportCli, TheReportOfATwoRankRunRendersEveryChartInAHeadlessBrowser) {
  const auto data = make_corpus_dir("report_cli", 8000, 2000);
  const auto config = write_tiny_config(data, 6, "");
  const auto out = scratch_dir("report_cli_out");
  const CliResult trained = run_cli(train_args(config, out, {"--dp", "2"}), kLimitS);
  ASSERT_EQ(trained.exit_code, 0) << trained.all();
  const CliResult report = run_cli({LATTICE_EXECUTABLE, "report", out.string()}, kLimitS);
  ASSERT_EQ(report.exit_code, 0) << report.all();
  EXPECT_NE(report.out.find("report of 2 rank(s) written to"), std::string::npos) << report.out;
  const std::string page = "file://" + (out / "report.html").string();
  // No network: the page must draw from what it holds.
  const CliResult dom =
      run_cli({"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--virtual-time-budget=10000", "--dump-dom", page},
              kLimitS);
  ASSERT_EQ(dom.exit_code, 0) << dom.all();
  EXPECT_NE(dom.out.find("data-charts=\"9\""), std::string::npos) << dom.out.substr(0, 2000);
  EXPECT_EQ(dom.out.find("data-error="), std::string::npos) << dom.out.substr(0, 2000);
  const size_t table = dom.out.find("id=\"heatmap\">");
  ASSERT_NE(table, std::string::npos);
  const std::string heatmap = dom.out.substr(table, dom.out.find("</table>", table) - table);
  size_t rows = 0;
  for (size_t at = heatmap.find("<tr><td>"); at != std::string::npos;
       at = heatmap.find("<tr><td>", at + 1)) {
    ++rows;
  }
  EXPECT_EQ(rows, 2u);  // one heatmap row per rank
}

TEST(ReportCli, ATracedPipelineRunShowsEachStagesBubbleNextToTheSchedules) {
  const auto data = make_corpus_dir("report_cli_pp", 8000, 2000);
  const auto config = write_tiny_config(data, 3, "");
  const auto out = scratch_dir("report_cli_pp_out");
  const CliResult trained = run_cli(train_args(config, out,
                                               {"--pp", "2", "--set", "batch.micro_batches=4",
                                                "--trace", (out / "trace").string()}),
                                    kLimitS);
  ASSERT_EQ(trained.exit_code, 0) << trained.all();
  ASSERT_EQ(run_cli({LATTICE_EXECUTABLE, "report", out.string()}, kLimitS).exit_code, 0);
  const std::string html = read_text(out / "report.html");
  const size_t begin = html.find("id=\"run-data\">") + std::string("id=\"run-data\">").size();
  const nlohmann::json embedded =
      nlohmann::json::parse(html.substr(begin, html.find("</script>", begin) - begin));
  const nlohmann::json& timeline = embedded.at("timeline");
  ASSERT_EQ(timeline.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    // The measured bubble is the trace's own summary of its last step; the theory is 1F1B's
    // (p − 1) / (m + p − 1) = 1/5 with unit costs.
    const RankTrace trace = read_chrome_trace(out / "trace" / chrome_trace_file_name(rank));
    const TraceWindow last = step_windows(trace.events).back();
    EXPECT_DOUBLE_EQ(timeline[rank].at("bubble").get<double>(),
                     summarize_rank_trace(rank, trace.events, last).bubble_fraction);
    EXPECT_DOUBLE_EQ(timeline[rank].at("theory").get<double>(), 0.2);
    EXPECT_EQ(timeline[rank].at("stage"), rank);
    EXPECT_FALSE(timeline[rank].at("bars").empty());
  }
  const CliResult dom = run_cli(
      {"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
       "--virtual-time-budget=10000", "--dump-dom", "file://" + (out / "report.html").string()},
      kLimitS);
  ASSERT_EQ(dom.exit_code, 0) << dom.all();
  EXPECT_NE(dom.out.find("data-charts=\"10\""), std::string::npos) << dom.out.substr(0, 2000);
  EXPECT_EQ(dom.out.find("data-error="), std::string::npos) << dom.out.substr(0, 2000);
  EXPECT_NE(dom.out.find("<td>20.0%</td>"), std::string::npos);  // the schedule's column
}

}  // namespace
}  // namespace lattice::testing
