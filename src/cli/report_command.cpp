// `lattice report RUN_DIR [--out FILE.html]`: one self-contained HTML page of a run's per-rank
// metrics (report/report.h), written to RUN_DIR/report.html unless --out says where.
#include <fmt/format.h>

#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "core/atomic_file.h"
#include "report/report.h"

namespace lattice::cli {

namespace {

struct ReportArgs {
  std::string run_dir;
  std::string out;
  std::string chart_js = kChartJsPath;
  std::string trace;  // --trace DIR; default: the run's (run.json), when it traced
};

void run_report(const ReportArgs& args) {
  const RunMetrics run = read_run_metrics(args.run_dir);
  const std::filesystem::path out = args.out.empty()
                                        ? std::filesystem::path(args.run_dir) / "report.html"
                                        : std::filesystem::path(args.out);
  std::filesystem::path trace = args.trace;
  if (trace.empty() && !run.info.value("trace", std::string()).empty()) {
    trace = run.info.at("trace").get<std::string>();
  }
  const std::string html =
      render_report(run, {.title = args.run_dir, .chart_js = args.chart_js, .trace_dir = trace});
  write_file_atomically(out, html);
  fmt::print("report of {} rank(s) written to {} ({:.0f} KiB, opens offline)\n", run.records.size(),
             out.string(), double(html.size()) / 1024);
}

}  // namespace

void register_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "One offline HTML page of a run's metrics: loss, throughput, memory, bandwidth, "
      "stragglers");
  cmd->add_option("run_dir", args->run_dir, "The run's output.dir (its metrics/ directory)")
      ->required();
  cmd->add_option("--out", args->out, "The HTML file (default: RUN_DIR/report.html)");
  cmd->add_option("--trace", args->trace,
                  "The run's --trace directory: the pipeline timeline of its last step (default: "
                  "the one the run recorded)");
  cmd->add_option("--chart-js", args->chart_js,
                  "Chart.js to inline (default: Debian's libjs-chart.js)");
  cmd->callback([args] { run_report(*args); });
}

}  // namespace lattice::cli
