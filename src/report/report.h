// `lattice report RUN_DIR`: one self-contained HTML page of a run's per-rank metrics
// (run/rank_metrics.h), with Chart.js (Debian's libjs-chart.js) inlined so that it opens offline:
// loss, validation loss, LR and grad norm; tokens/s and MFU; each rank's memory by category and
// the arenas' fragmentation; each group's bus bandwidth per collective; a heatmap of every
// rank's busy time per step against the step's median (stragglers); and with traces the
// pipeline timeline of a step with each stage's bubble next to the schedule's.
// docs/observability.md.
#pragma once

#include <filesystem>
#include <string>

#include "run/rank_metrics.h"

namespace lattice {

// Where Debian's libjs-chart.js puts the UMD build (the global `Chart`).
inline constexpr const char* kChartJsPath = "/usr/share/javascript/chart.js/chart.min.js";

struct ReportOptions {
  std::string title;                              // shown at the top
  std::filesystem::path chart_js = kChartJsPath;  // inlined whole
  // `lattice train --trace DIR`'s per-rank files: the timeline of the last traced step, each
  // rank's measured bubble next to the schedule's (simulated with unit costs). Empty: none.
  std::filesystem::path trace_dir = {};
};

// The page. The script sets <body data-charts="N" data-resources="R"> once it has drawn N
// charts with data (R: what it fetched, 0), writes what each chart drew into <pre id="drawn">
// (JSON: {chart: [{label, data}]}), or sets data-error="..." when a script failed (the tests
// read all three from a headless browser). IoError
// naming the file and `scripts/setup.sh` when Chart.js is not installed.
std::string render_report(const RunMetrics& run, const ReportOptions& options);

}  // namespace lattice
