// `lattice report` through the executable, rendered by headless Chromium offline: every chart
// drawn with data equal to the metrics files (and run.json's plan), nothing fetched, no script
// error or console message, the heatmap's cells the busy times of the files.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "cli/cli_run.h"
#include "comm/comm_stats.h"
#include "comm/cost_model.h"
#include "core/statistics.h"
#include "run/rank_metrics.h"
#include "support/scratch_dir.h"
#include "trace/chrome_trace.h"
#include "trace/trace_summary.h"
#include "train/test_corpus.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 120;
constexpr double kMiB = 1048576;

// The page as headless Chromium leaves it: the DOM, the browser's log (console messages are
// logged as "CONSOLE"), and what each chart drew (<pre id="drawn">).
struct RenderedPage {
  CliResult browser;
  nlohmann::json drawn;
};

RenderedPage render(const std::filesystem::path& html, const std::string& fragment = "") {
  RenderedPage page;
  // No network: the page must draw from what it holds.
  page.browser =
      run_cli({"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom",
               "file://" + html.string() + fragment},
              kLimitS);
  const std::string& dom = page.browser.out;
  const std::string open = "<pre id=\"drawn\" hidden=\"\">";
  const size_t begin = dom.find(open);
  if (begin == std::string::npos) return page;
  std::string text =
      dom.substr(begin + open.size(), dom.find("</pre>", begin) - begin - open.size());
  for (const auto& [entity, ch] :
       {std::pair<std::string, std::string>{"&lt;", "<"}, {"&gt;", ">"}, {"&amp;", "&"}}) {
    for (size_t at = text.find(entity); at != std::string::npos; at = text.find(entity, at + 1))
      text.replace(at, entity.size(), ch);
  }
  page.drawn = nlohmann::json::parse(text);
  return page;
}

// A drawn dataset's points as (x, y).
std::vector<std::pair<double, double>> xy(const nlohmann::json& dataset) {
  std::vector<std::pair<double, double>> out;
  for (const nlohmann::json& p : dataset.at("data"))
    out.emplace_back(p[0].get<double>(), p[1].get<double>());
  return out;
}

const nlohmann::json& dataset(const nlohmann::json& drawn, const std::string& chart,
                              const std::string& label) {
  for (const nlohmann::json& d : drawn.at(chart))
    if (d.at("label") == label) return d;
  ADD_FAILURE() << chart << " has no dataset '" << label << "': " << drawn.at(chart).dump();
  static const nlohmann::json none = {{"label", ""}, {"data", nlohmann::json::array()}};
  return none;
}

void expect_series(const std::vector<std::pair<double, double>>& drawn,
                   const std::vector<std::pair<double, double>>& expected,
                   const std::string& what) {
  ASSERT_EQ(drawn.size(), expected.size()) << what;
  for (size_t i = 0; i < drawn.size(); ++i) {
    EXPECT_EQ(drawn[i].first, expected[i].first) << what << " point " << i;
    EXPECT_NEAR(drawn[i].second, expected[i].second, 1e-9 * std::abs(expected[i].second) + 1e-12)
        << what << " point " << i;
  }
}

// A rank's records as (step, value) where `value` has one.
std::vector<std::pair<double, double>> series(
    const std::vector<nlohmann::json>& records,
    const std::function<std::optional<double>(const nlohmann::json&)>& value) {
  std::vector<std::pair<double, double>> out;
  for (const nlohmann::json& j : records) {
    const std::optional<double> v = value(j);
    if (v) out.emplace_back(j.at("step").get<double>(), *v);
  }
  return out;
}

// A profile of every collective and algorithm on 2 ranks (10 us + 10 GB/s): each record's
// profile_share is then the speed of those calls against it.
std::filesystem::path write_comm_profile(const std::filesystem::path& dir) {
  CostProfile profile;
  for (int c = 0; c < kCollectiveCount; ++c) {
    for (int a = 0; a < kAlgorithmCount; ++a)
      profile.set(Collective(c), Algorithm(a), 2, CostModel{1e-5, 1e-10, {}});
  }
  const auto path = dir / "comm-profile.json";
  profile.save(path.string(), TransportKind::kThreads);
  return path;
}

// Each chart's data, as the browser drew it, against the metrics files of a two-rank run
// trained with a plan and a calibrated profile.
TEST(ReportCli, EveryChartOfATwoRankRunDrawsTheMetricsFilesInAHeadlessBrowser) {
  const auto data = make_corpus_dir("report_cli", 8000, 2000);
  const auto config = write_tiny_config(data, 6, "[eval]\ninterval = 3\nbatches = 2\n");
  const auto out = scratch_dir("report_cli_out");
  const auto profile = write_comm_profile(data);
  const CliResult trained = run_cli(train_args(config, out,
                                               {"--dp", "2", "--plan", "dgx-h100", "--set",
                                                "parallel.comm_profile=" + profile.string()}),
                                    kLimitS);
  ASSERT_EQ(trained.exit_code, 0) << trained.all();
  EXPECT_NE(trained.out.find("plan (dgx-h100, dp=2 tp=1 pp=1"), std::string::npos) << trained.out;
  const CliResult report = run_cli({LATTICE_EXECUTABLE, "report", out.string()}, kLimitS);
  ASSERT_EQ(report.exit_code, 0) << report.all();
  EXPECT_NE(report.out.find("report of 2 rank(s) written to"), std::string::npos) << report.out;
  const RenderedPage page = render(out / "report.html");
  ASSERT_EQ(page.browser.exit_code, 0) << page.browser.all();
  const std::string& dom = page.browser.out;
  EXPECT_NE(dom.find("data-charts=\"12\""), std::string::npos) << dom.substr(0, 2000);
  EXPECT_NE(dom.find("data-resources=\"0\""), std::string::npos) << dom.substr(0, 2000);
  EXPECT_EQ(dom.find("data-error="), std::string::npos) << dom.substr(0, 2000);
  EXPECT_EQ(page.browser.err.find("CONSOLE"), std::string::npos) << page.browser.err;
  ASSERT_TRUE(page.drawn.is_object()) << dom.substr(0, 2000);
  const nlohmann::json& drawn = page.drawn;

  const RunMetrics run = read_run_metrics(out);
  ASSERT_EQ(run.records.size(), 2u);
  const std::vector<nlohmann::json>& rank0 = run.records[0];
  ASSERT_EQ(rank0.size(), 6u);
  auto key = [](const char* k, double scale = 1.0) {
    return [k, scale](const nlohmann::json& j) -> std::optional<double> {
      if (!j.contains(k)) return std::nullopt;
      return j.at(k).get<double>() * scale;
    };
  };
  expect_series(xy(dataset(drawn, "loss", "loss")), series(rank0, key("loss")), "loss");
  const auto val = series(rank0, key("val_loss"));
  EXPECT_EQ(val.size(), 2u);  // steps 3 and 6
  expect_series(xy(dataset(drawn, "loss", "validation loss")), val, "validation loss");
  expect_series(xy(dataset(drawn, "lr", "learning rate")), series(rank0, key("lr")), "lr");
  expect_series(xy(dataset(drawn, "grad-norm", "grad norm (before clipping)")),
                series(rank0, key("grad_norm")), "grad norm");
  expect_series(xy(dataset(drawn, "throughput", "tokens/s")), series(rank0, key("tokens_per_s")),
                "tokens/s");
  expect_series(xy(dataset(drawn, "mfu", "MFU")), series(rank0, key("mfu", 100)), "MFU");

  for (const auto& item : rank0.back().at("memory").at("live").items()) {
    const std::string category = item.key();  // clang 14 captures no structured binding
    const nlohmann::json& bars = dataset(drawn, "memory", category).at("data");
    ASSERT_EQ(bars.size(), 2u) << category;
    for (int rank = 0; rank < 2; ++rank) {
      const double expected = run.records[rank].back().at("memory").at("live").at(category);
      EXPECT_NEAR(bars[rank].get<double>(), expected / kMiB, 1e-12) << category << " rank " << rank;
    }
    expect_series(xy(dataset(drawn, "memory-steps", category)),
                  series(rank0,
                         [&](const nlohmann::json& j) -> std::optional<double> {
                           return j.at("memory").at("live").at(category).get<double>() / kMiB;
                         }),
                  "rank 0's " + category + " over the steps");
  }
  for (int rank = 0; rank < 2; ++rank) {
    const std::string label = "rank " + std::to_string(rank);
    const std::vector<nlohmann::json>& records = run.records[rank];
    expect_series(xy(dataset(drawn, "memory-ranks", label)),
                  series(records,
                         [](const nlohmann::json& j) -> std::optional<double> {
                           return j.at("memory").at("live_bytes").get<double>() / kMiB;
                         }),
                  label + " live memory");
    expect_series(xy(dataset(drawn, "fragmentation", label)),
                  series(records,
                         [](const nlohmann::json& j) -> std::optional<double> {
                           return 100 * j.at("memory").at("fragmentation").get<double>();
                         }),
                  label + " fragmentation");
  }

  // The dp group's all-reduce: each step's busbw over both ranks weighted by the calls' time,
  // and the calibrated profile's speed for the same calls (busbw ÷ profile_share).
  std::vector<std::pair<double, double>> busbw, calibrated;
  for (size_t i = 0; i < rank0.size(); ++i) {
    double weighted = 0, profiled = 0, seconds = 0;
    for (const auto& records : run.records) {
      for (const nlohmann::json& c : records[i].at("comm")) {
        if (c.at("collective") != "all_reduce") continue;
        const double s = c.at("seconds").get<double>();
        weighted += c.at("busbw").get<double>() * s;
        ASSERT_TRUE(c.contains("profile_share")) << c.dump();
        profiled += c.at("busbw").get<double>() / c.at("profile_share").get<double>() * s;
        seconds += s;
      }
    }
    ASSERT_GT(seconds, 0) << "step " << i + 1;
    busbw.emplace_back(double(i + 1), weighted / seconds / 1e9);
    calibrated.emplace_back(double(i + 1), profiled / seconds / 1e9);
  }
  const std::string group = rank0.back().at("comm")[0].at("group").get<std::string>();
  expect_series(xy(dataset(drawn, "bandwidth", group + " all_reduce")), busbw, "dp busbw");
  expect_series(xy(dataset(drawn, "bandwidth", group + " all_reduce at the calibrated speed")),
                calibrated, "dp calibrated speed");

  // The heatmap: one row per rank, each cell its busy time over the other rank's.
  const size_t table = dom.find("id=\"heatmap\">");
  ASSERT_NE(table, std::string::npos);
  const std::string heatmap = dom.substr(table, dom.find("</table>", table) - table);
  for (int rank = 0; rank < 2; ++rank) {
    for (size_t i = 0; i < rank0.size(); ++i) {
      const double mine = run.records[rank][i].at("parts").at("busy_ms").get<double>();
      const double other = run.records[1 - rank][i].at("parts").at("busy_ms").get<double>();
      const std::string cell = fmt::format("title=\"rank {}, step {}: ", rank, i + 1);
      const size_t at = heatmap.find(cell);
      ASSERT_NE(at, std::string::npos) << cell;
      double ms = 0, ratio = 0;
      ASSERT_EQ(std::sscanf(heatmap.c_str() + at + cell.size(), "%lf ms, %lfx", &ms, &ratio), 2);
      EXPECT_NEAR(ms, mine, 0.051) << cell;
      EXPECT_NEAR(ratio, mine / other, 0.0051) << cell;
    }
  }

  // The plan: run.json's forecast next to the highest peaks and rank 0's median step.
  const nlohmann::json& plan = run.info.at("plan");
  const nlohmann::json& stage = plan.at("stages").at(0);
  const std::vector<std::string> quantities = {"parameters",  "gradients",     "optimizer states",
                                               "activations", "other buffers", "total"};
  const nlohmann::json& predicted = dataset(drawn, "plan-memory", "predicted").at("data");
  const nlohmann::json& measured = dataset(drawn, "plan-memory", "measured").at("data");
  ASSERT_EQ(predicted.size(), quantities.size());
  ASSERT_EQ(measured.size(), quantities.size());
  double peak = 0, parameters = 0;
  for (const auto& records : run.records) {
    for (const nlohmann::json& j : records) {
      peak = std::max(peak, j.at("memory").at("peak_bytes").get<double>());
      parameters = std::max(parameters, j.at("memory").at("peak").at("parameters").get<double>());
    }
  }
  for (size_t q = 0; q < quantities.size(); ++q) {
    EXPECT_NEAR(predicted[q].get<double>(), stage.at(quantities[q]).get<double>() / kMiB, 1e-12)
        << quantities[q];
  }
  EXPECT_NEAR(measured[0].get<double>(), parameters / kMiB, 1e-12);
  EXPECT_NEAR(measured[5].get<double>(), peak / kMiB, 1e-12);
  // The planner counts the runtime's buffers ('lattice' model): its parameters are this run's.
  EXPECT_NEAR(predicted[0].get<double>(), parameters / kMiB, 0.01 * parameters / kMiB);
  std::vector<double> step_ms;
  for (size_t i = 1; i < rank0.size(); ++i) step_ms.push_back(rank0[i].at("ms").get<double>());
  const nlohmann::json& time_predicted = dataset(drawn, "plan-time", "predicted").at("data");
  const nlohmann::json& time_measured = dataset(drawn, "plan-time", "measured").at("data");
  EXPECT_NEAR(time_predicted[0].get<double>(), plan.at("step_ms").get<double>(), 1e-12);
  EXPECT_NEAR(time_measured[0].get<double>(), median(step_ms), 1e-9);
}

// Without --plan or a profile the page says how to get them, and still draws the rest.
TEST(ReportCli, WithoutAPlanOrAProfileThePageSaysHowToGetThem) {
  const auto data = make_corpus_dir("report_cli_bare", 8000, 2000);
  const auto config = write_tiny_config(data, 3, "");
  const auto out = scratch_dir("report_cli_bare_out");
  ASSERT_EQ(run_cli(train_args(config, out, {"--dp", "2"}), kLimitS).exit_code, 0);
  ASSERT_EQ(run_cli({LATTICE_EXECUTABLE, "report", out.string()}, kLimitS).exit_code, 0);
  const RenderedPage page = render(out / "report.html");
  ASSERT_EQ(page.browser.exit_code, 0) << page.browser.all();
  const std::string& dom = page.browser.out;
  EXPECT_NE(dom.find("data-charts=\"10\""), std::string::npos) << dom.substr(0, 2000);
  EXPECT_NE(dom.find("No plan: lattice train --plan CLUSTER"), std::string::npos);
  EXPECT_NE(dom.find("No calibrated profile: parallel.comm_profile"), std::string::npos);
  EXPECT_FALSE(page.drawn.contains("plan-memory"));
  // A screenshot of the page, as docs/observability.md's is taken: a PNG of the whole height.
  const auto png = out / "report.png";
  const CliResult shot =
      run_cli({"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--hide-scrollbars", "--virtual-time-budget=10000", "--window-size=1200,6000",
               "--screenshot=" + png.string(), "file://" + (out / "report.html").string()},
              kLimitS);
  ASSERT_EQ(shot.exit_code, 0) << shot.all();
  const std::string image = read_text(png);
  ASSERT_GT(image.size(), 24u);
  EXPECT_EQ(image.substr(1, 3), "PNG");
  // Width and height, big-endian in the IHDR chunk.
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(image[at])) << 24) | (uint32_t(uint8_t(image[at + 1])) << 16) |
           (uint32_t(uint8_t(image[at + 2])) << 8) | uint32_t(uint8_t(image[at + 3]));
  };
  EXPECT_EQ(be32(16), 1200u);
  EXPECT_EQ(be32(20), 6000u);
  EXPECT_GT(image.size(), 50000u);  // charts drawn, not a blank page
}

// --plan needs the run directory it writes the forecast into, and a cluster it knows.
TEST(ReportCli, APlanWithoutAnOutputDirOrWithAnUnknownClusterIsRefused) {
  const auto data = make_corpus_dir("report_cli_plan_bad", 8000, 2000);
  const auto config = write_tiny_config(data, 1, "");
  const CliResult no_dir =
      run_cli({LATTICE_EXECUTABLE, "train", config.string(), "--plan", "dgx-h100"}, kLimitS);
  EXPECT_NE(no_dir.exit_code, 0);
  EXPECT_NE(no_dir.err.find("--set output.dir=DIR"), std::string::npos) << no_dir.all();
  const CliResult unknown = run_cli(
      train_args(config, scratch_dir("report_cli_plan_bad_out"), {"--plan", "no-such-cluster"}),
      kLimitS);
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.err.find("no-such-cluster"), std::string::npos) << unknown.all();
}

TEST(ReportCli, ATracedPipelineRunShowsEachStagesBubbleNextToTheSchedules) {
  const auto data = make_corpus_dir("report_cli_pp", 8000, 2000);
  const auto config = write_tiny_config(data, 3, "");
  const auto out = scratch_dir("report_cli_pp_out");
  const CliResult trained =
      run_cli(train_args(config, out,
                         {"--pp", "2", "--set", "batch.micro_batches=4", "--trace",
                          (out / "trace").string(), "--plan", "dgx-h100"}),
              kLimitS);
  ASSERT_EQ(trained.exit_code, 0) << trained.all();
  ASSERT_EQ(run_cli({LATTICE_EXECUTABLE, "report", out.string()}, kLimitS).exit_code, 0);
  const std::string html = read_text(out / "report.html");
  const size_t begin = html.find("id=\"run-data\">") + std::string("id=\"run-data\">").size();
  const nlohmann::json embedded =
      nlohmann::json::parse(html.substr(begin, html.find("</script>", begin) - begin));
  const nlohmann::json& timeline = embedded.at("timeline");
  ASSERT_EQ(timeline.size(), 2u);
  const RenderedPage page = render(out / "report.html");
  ASSERT_EQ(page.browser.exit_code, 0) << page.browser.all();
  ASSERT_TRUE(page.drawn.contains("timeline")) << page.browser.out.substr(0, 2000);
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
    // The drawn bars: one per event of the step's window, by category, on the rank's row.
    std::map<std::string, int> events, bars;
    for (const TraceEvent& e : trace.events) {
      if (e.category != TraceCategory::kStep && e.end_ns > last.start_ns &&
          e.start_ns < last.end_ns) {
        ++events[std::string(trace_category_name(e.category))];
      }
    }
    for (const nlohmann::json& d : page.drawn.at("timeline")) {
      for (const nlohmann::json& bar : d.at("data")) {
        if (bar[1] == "rank " + std::to_string(rank)) ++bars[d.at("label").get<std::string>()];
      }
    }
    EXPECT_EQ(bars, events) << "rank " << rank;
  }
  // The plan per stage: each stage's quantities against its own rank's peaks.
  const RunMetrics run = read_run_metrics(out);
  const nlohmann::json& measured = dataset(page.drawn, "plan-memory", "measured").at("data");
  ASSERT_EQ(measured.size(), 12u);  // 2 stages x 6 quantities
  for (int stage = 0; stage < 2; ++stage) {
    double peak = 0;
    for (const nlohmann::json& j : run.records[size_t(stage)])
      peak = std::max(peak, j.at("memory").at("peak_bytes").get<double>());
    EXPECT_NEAR(measured[size_t(6 * stage + 5)].get<double>(), peak / kMiB, 1e-12);
  }
  // Another rank's stacked memory, chosen through the address (the page's rank selector).
  const RenderedPage rank1 = render(out / "report.html", "#memory-rank=1");
  ASSERT_TRUE(rank1.drawn.is_object()) << rank1.browser.all();
  for (const auto& item : run.records[1].back().at("memory").at("live").items()) {
    const std::string category = item.key();  // clang 14 captures no structured binding
    expect_series(xy(dataset(rank1.drawn, "memory-steps", category)),
                  series(run.records[1],
                         [&](const nlohmann::json& j) -> std::optional<double> {
                           return j.at("memory").at("live").at(category).get<double>() / kMiB;
                         }),
                  "rank 1's " + category + " over the steps");
  }
  // The stages hold different layers: rank 1's memory is not rank 0's.
  EXPECT_NE(run.records[1].back().at("memory").at("live").at("parameters"),
            run.records[0].back().at("memory").at("live").at("parameters"));
  const std::string& dom = page.browser.out;
  EXPECT_NE(dom.find("data-charts=\"13\""), std::string::npos) << dom.substr(0, 2000);
  EXPECT_NE(dom.find("<td>stage 1 total</td>"), std::string::npos);
  EXPECT_EQ(dom.find("data-error="), std::string::npos) << dom.substr(0, 2000);
  EXPECT_EQ(page.browser.err.find("CONSOLE"), std::string::npos) << page.browser.err;
  EXPECT_NE(dom.find("<td>20.0%</td>"), std::string::npos);  // the schedule's column
}

}  // namespace
}  // namespace lattice::testing
