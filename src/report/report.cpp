#include "report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/statistics.h"
#include "run/traced_steps.h"
#include "trace/trace_event.h"

namespace lattice {

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    LATTICE_THROW(IoError,
                  "cannot read Chart.js at '{}' ---> HINT: bash scripts/setup.sh installs "
                  "libjs-chart.js",
                  path.string());
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Text that may sit inside a <script> element: no "</script" can end it early.
std::string script_safe(std::string text) {
  for (size_t at = text.find("</"); at != std::string::npos; at = text.find("</", at + 2)) {
    text.replace(at, 2, "<\\/");
  }
  return text;
}

std::string html_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// What the page draws, small enough to embed: per rank its steps' series, per group and
// collective the bus bandwidth of each step over the group's ranks (time-weighted).
nlohmann::json page_data(const RunMetrics& run) {
  nlohmann::json ranks = nlohmann::json::array();
  // (group, collective) -> step -> sums over the group's ranks and algorithms: the bus
  // bandwidth of the step's calls weighted by their time, and with a calibrated profile the
  // profile's speed for the same calls (busbw ÷ profile_share) weighted alike.
  struct BandwidthSums {
    double busbw_seconds = 0, seconds = 0;
    double profile_seconds = 0, profiled = 0;
  };
  std::map<std::string, std::map<int64_t, BandwidthSums>> bandwidth;
  for (const std::vector<nlohmann::json>& records : run.records) {
    nlohmann::json r = {
        {"steps", nlohmann::json::array()},         {"loss", nlohmann::json::array()},
        {"val_loss", nlohmann::json::array()},      {"lr", nlohmann::json::array()},
        {"grad_norm", nlohmann::json::array()},     {"tokens_per_s", nlohmann::json::array()},
        {"mfu", nlohmann::json::array()},           {"busy_ms", nlohmann::json::array()},
        {"fragmentation", nlohmann::json::array()}, {"memory", nlohmann::json::object()},
        {"memory_steps", nlohmann::json::object()}, {"live_mib", nlohmann::json::array()}};
    for (const nlohmann::json& j : records) {
      const int64_t step = j.at("step").get<int64_t>();
      r["steps"].push_back(step);
      for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s", "mfu"}) {
        r[key].push_back(j.value(key, nlohmann::json()));
      }
      r["val_loss"].push_back(j.value("val_loss", nlohmann::json()));
      r["busy_ms"].push_back(j.at("parts").value("busy_ms", j.value("ms", 0.0)));
      r["fragmentation"].push_back(j.at("memory").value("fragmentation", 0.0));
      r["live_mib"].push_back(j.at("memory").value("live_bytes", 0.0) / 1048576);
      r["memory"] = j.at("memory").value("live", nlohmann::json::object());  // the last step's
      for (const auto& [category, bytes] : r["memory"].items()) {
        r["memory_steps"][category].push_back(bytes.get<double>() / 1048576);  // MiB, every step
      }
      r["rank"] = j.value("rank", 0);
      r["at"] = j.value("at", nlohmann::json::object());
      for (const nlohmann::json& c : j.value("comm", nlohmann::json::array())) {
        const std::string key = fmt::format("{} {}", c.at("group").get<std::string>(),
                                            c.at("collective").get<std::string>());
        const double seconds = c.value("seconds", 1.0);
        const double busbw = c.at("busbw").get<double>();
        BandwidthSums& sums = bandwidth[key][step];
        sums.busbw_seconds += busbw * seconds;
        sums.seconds += seconds;
        const double share = c.value("profile_share", 0.0);
        if (share > 0) {
          sums.profile_seconds += busbw / share * seconds;
          sums.profiled += seconds;
        }
      }
    }
    ranks.push_back(std::move(r));
  }
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& [key, by_step] : bandwidth) {
    nlohmann::json g = {{"name", key},
                        {"steps", nlohmann::json::array()},
                        {"busbw_gbs", nlohmann::json::array()},
                        {"profile_gbs", nlohmann::json::array()}};
    bool profiled = false;
    for (const auto& [step, sums] : by_step) {
      g["steps"].push_back(step);
      g["busbw_gbs"].push_back(sums.seconds > 0 ? sums.busbw_seconds / sums.seconds / 1e9 : 0.0);
      g["profile_gbs"].push_back(sums.profiled > 0
                                     ? nlohmann::json(sums.profile_seconds / sums.profiled / 1e9)
                                     : nlohmann::json());
      profiled = profiled || sums.profiled > 0;
    }
    if (!profiled) g.erase("profile_gbs");
    groups.push_back(std::move(g));
  }
  return {{"ranks", std::move(ranks)}, {"bandwidth", std::move(groups)}};
}

// The planner's forecast (run.json's "plan", `lattice train --plan`) next to what the run
// measured: per pipeline stage each memory quantity against the highest peak of that stage's
// ranks (the arena's categories grouped as plan --validate groups them), and the step and its
// parts against rank 0's medians (its first step, the warm-up, left out when there are more).
nlohmann::json plan_data(const RunMetrics& run) {
  const nlohmann::json plan = run.info.value("plan", nlohmann::json());
  if (!plan.is_object()) return nullptr;
  nlohmann::json out = {{"source", plan.value("source", std::string())},
                        {"layout", plan.value("layout", std::string())}};
  if (plan.contains("rejected")) {
    out["rejected"] = plan.at("rejected");
    return out;
  }
  static constexpr const char* kQuantities[] = {"parameters",  "gradients",     "optimizer states",
                                                "activations", "other buffers", "total"};
  // One rank's record as those quantities: its peaks per category, its peak in all.
  auto measured_bytes = [](const nlohmann::json& memory) {
    const nlohmann::json peak = memory.value("peak", nlohmann::json::object());
    auto bytes = [&](const char* category) { return peak.value(category, 0.0); };
    return std::vector<double>{bytes("parameters"),
                               bytes("gradients"),
                               bytes("optimizer_state"),
                               bytes("activations"),
                               bytes("workspace") + bytes("communication") + bytes("other"),
                               memory.value("peak_bytes", 0.0)};
  };
  out["quantities"] = kQuantities;
  out["stages"] = nlohmann::json::array();
  for (const nlohmann::json& stage : plan.at("stages")) {
    const int s = stage.at("stage").get<int>();
    std::vector<double> predicted, measured(std::size(kQuantities), 0.0);
    for (const char* q : kQuantities) predicted.push_back(stage.value(q, 0.0));
    for (const std::vector<nlohmann::json>& records : run.records) {
      for (const nlohmann::json& j : records) {
        if (j.value("at", nlohmann::json::object()).value("pp", 0) != s) continue;
        const std::vector<double> bytes = measured_bytes(j.at("memory"));
        for (size_t q = 0; q < bytes.size(); ++q) measured[q] = std::max(measured[q], bytes[q]);
      }
    }
    out["stages"].push_back({{"stage", s}, {"predicted", predicted}, {"measured", measured}});
  }
  std::vector<std::vector<double>> parts(5);  // step, compute, optimizer, exposed, idle
  const std::vector<nlohmann::json>& first = run.records.front();
  for (size_t i = first.size() > 1 ? 1 : 0; i < first.size(); ++i) {
    const nlohmann::json& j = first[i];
    const nlohmann::json p = j.value("parts", nlohmann::json::object());
    parts[0].push_back(j.value("ms", 0.0));
    parts[1].push_back(p.value("forward_ms", 0.0) + p.value("backward_ms", 0.0) +
                       p.value("pipeline_compute_ms", 0.0));
    parts[2].push_back(p.value("optimizer_ms", 0.0));
    parts[3].push_back(p.value("exposed_comm_ms", 0.0));
    parts[4].push_back(p.value("pipeline_idle_ms", 0.0));
  }
  const nlohmann::json predicted_parts = plan.at("parts_ms");
  std::vector<double> measured;
  for (const std::vector<double>& values : parts)
    measured.push_back(values.empty() ? 0.0 : median(values));
  out["time"] = {
      {"labels", {"step", "compute", "optimizer", "exposed dp comm", "pipeline idle"}},
      {"predicted",
       {plan.at("step_ms").get<double>(), predicted_parts.value("compute", 0.0),
        predicted_parts.value("optimizer", 0.0), predicted_parts.value("exposed_comm", 0.0),
        predicted_parts.value("pipeline_idle", 0.0)}},
      {"measured", measured}};
  return out;
}

// The last step of every rank's trace (run/traced_steps.h): its events (ms from the step's
// start) by category, and each rank's measured bubble next to the schedule's.
nlohmann::json timeline_data(const std::filesystem::path& dir, const RunMetrics& run) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const TracedStep& step : last_traced_steps(dir, run)) {
    nlohmann::json bars = nlohmann::json::array();
    for (const TraceEvent& e : step.events) {
      bars.push_back(
          {std::string(trace_category_name(e.category)), e.name,
           double(std::max(e.start_ns, step.window.start_ns) - step.window.start_ns) / 1e6,
           double(std::min(e.end_ns, step.window.end_ns) - step.window.start_ns) / 1e6});
    }
    nlohmann::json r = {{"rank", step.rank},
                        {"stage", step.stage},
                        {"step_ms", double(step.window.length_ns()) / 1e6},
                        {"bubble", step.bubble},
                        {"bars", std::move(bars)}};
    if (step.theory) r["theory"] = *step.theory;
    ranks.push_back(std::move(r));
  }
  return ranks;
}

// The page's own script: one chart per canvas, the heatmap as a table.
constexpr const char* kPageScript = R"JS(
(function () {
  const run = JSON.parse(document.getElementById('run-data').textContent);
  const ranks = run.ranks;
  const palette = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
                   '#7f7f7f', '#bcbd22', '#17becf'];
  const color = (i) => palette[i % palette.length];
  // What each chart drew, written into the page (#drawn) for the tests to compare with the
  // metrics: {id: [{label, data: [[x, y], ...] or [y, ...]}]}.
  const drawn = {};
  function register(id, chart) {
    drawn[id] = chart.data.datasets.map((d) => ({
      label: d.label, data: d.data.map((p) => (p !== null && typeof p === 'object') ? [p.x, p.y] : p) }));
  }
  function line(id, datasets, y) {
    const chart = new Chart(document.getElementById(id), {
      type: 'line',
      data: { datasets: datasets },
      options: { animation: false, parsing: false, normalized: true, spanGaps: true,
                 scales: { x: { type: 'linear', title: { display: true, text: 'step' } },
                           y: Object.assign({ title: { display: true, text: y } }) } }
    });
    register(id, chart);
  }
  const points = (xs, ys) => xs.map((x, i) => ({ x: x, y: ys[i] })).filter((p) => p.y !== null);
  const first = ranks[0];
  line('loss', [
    { label: 'loss', data: points(first.steps, first.loss), borderColor: color(0), pointRadius: 0 },
    { label: 'validation loss', data: points(first.steps, first.val_loss), borderColor: color(1),
      showLine: true }], 'loss');
  line('lr', [{ label: 'learning rate', data: points(first.steps, first.lr),
                borderColor: color(2), pointRadius: 0 }], 'lr');
  line('grad-norm', [{ label: 'grad norm (before clipping)', data: points(first.steps, first.grad_norm),
                       borderColor: color(3), pointRadius: 0 }], 'norm');
  line('throughput', [{ label: 'tokens/s', data: points(first.steps, first.tokens_per_s),
                        borderColor: color(0), pointRadius: 0 }], 'tokens/s');
  line('mfu', [{ label: 'MFU', data: points(first.steps, first.mfu.map((v) => v === null ? null : 100 * v)),
                 borderColor: color(4), pointRadius: 0 }], '%');
  const categories = Object.keys(first.memory);
  const memory = new Chart(document.getElementById('memory'), {
    type: 'bar',
    data: { labels: ranks.map((r) => 'rank ' + r.rank),
            datasets: categories.map((c, i) => ({ label: c, backgroundColor: color(i),
              data: ranks.map((r) => (r.memory[c] || 0) / 1048576) })) },
    options: { animation: false, scales: { x: { stacked: true },
               y: { stacked: true, title: { display: true, text: 'MiB live at the last step' } } } }
  });
  register('memory', memory);
  // One rank's live memory over the steps, stacked by category: the rank chosen in the
  // selector, rank 0 at first or the one the address names (report.html#memory-rank=3).
  const chosen = /memory-rank=(\d+)/.exec(window.location.hash);
  const selector = document.getElementById('memory-rank');
  selector.innerHTML = ranks.map((r, i) => '<option value="' + i + '">rank ' + r.rank + '</option>')
      .join('');
  const stackedSets = (r) => Object.keys(r.memory_steps).map((c, i) => ({ label: c, fill: true,
      backgroundColor: color(i), borderColor: color(i), pointRadius: 0,
      data: points(r.steps, r.memory_steps[c]) }));
  const initial = chosen ? Math.max(0, ranks.findIndex((r) => r.rank === Number(chosen[1]))) : 0;
  selector.value = String(initial);
  const overSteps = new Chart(document.getElementById('memory-steps'), {
    type: 'line',
    data: { datasets: stackedSets(ranks[initial]) },
    options: { animation: false, parsing: false, normalized: true,
               scales: { x: { type: 'linear', title: { display: true, text: 'step' } },
                         y: { stacked: true, beginAtZero: true,
                              title: { display: true, text: 'MiB live' } } } }
  });
  register('memory-steps', overSteps);
  selector.addEventListener('change', () => {
    overSteps.data.datasets = stackedSets(ranks[Number(selector.value)]);
    overSteps.update();
  });
  line('memory-ranks', ranks.map((r, i) => ({ label: 'rank ' + r.rank,
        data: points(r.steps, r.live_mib), borderColor: color(i), pointRadius: 0 })), 'MiB live');
  line('fragmentation', ranks.map((r, i) => ({ label: 'rank ' + r.rank,
        data: points(r.steps, r.fragmentation.map((v) => 100 * v)), borderColor: color(i),
        pointRadius: 0 })), '% of free bytes');
  if (run.bandwidth.length > 0) {
    // With a calibrated profile each group also gets the profile's speed for the same calls,
    // dashed: the measured line's distance below it is the share of the link the group got.
    const sets = [];
    run.bandwidth.forEach((g, i) => {
      sets.push({ label: g.name, data: points(g.steps, g.busbw_gbs), borderColor: color(i),
                  pointRadius: 0 });
      if (g.profile_gbs !== undefined) {
        sets.push({ label: g.name + ' at the calibrated speed', data: points(g.steps, g.profile_gbs),
                    borderColor: color(i), borderDash: [6, 4], pointRadius: 0 });
      }
    });
    line('bandwidth', sets, 'bus bandwidth, GB/s');
    if (!run.bandwidth.some((g) => g.profile_gbs !== undefined)) {
      document.getElementById('bandwidth-note').textContent = 'No calibrated profile: ' +
          'parallel.comm_profile = FILE (lattice bench comm --calibrate FILE) adds each ' +
          'group\'s calibrated speed for the same calls.';
    }
  } else {
    document.getElementById('bandwidth-note').textContent = 'One rank: no collectives.';
  }
  // Heatmap: each rank's busy time over the median of the step, one cell per rank and step.
  const table = document.getElementById('heatmap');
  const steps = first.steps;
  const stride = Math.max(1, Math.ceil(steps.length / 200));
  let header = '<tr><th>rank</th>';
  for (let s = 0; s < steps.length; s += stride) header += '<th title="step ' + steps[s] + '"></th>';
  let body = header + '</tr>';
  for (const r of ranks) {
    body += '<tr><td>' + r.rank + '</td>';
    for (let s = 0; s < steps.length; s += stride) {
      // Over the other ranks' median, the live straggler warning's rule.
      const others = ranks.filter((o) => o !== r).map((o) => o.busy_ms[s])
          .filter((v) => v !== undefined).sort((a, b) => a - b);
      const n = others.length;
      const median = n === 0 ? (r.busy_ms[s] || 1)
          : (n % 2 === 1 ? others[(n - 1) / 2] : (others[n / 2 - 1] + others[n / 2]) / 2) || 1;
      const ratio = (r.busy_ms[s] || 0) / median;
      const heat = Math.min(1, Math.max(0, (ratio - 1) / 1.5));
      const shade = 'rgb(255,' + Math.round(255 * (1 - heat)) + ',' + Math.round(255 * (1 - heat)) + ')';
      body += '<td style="background:' + shade + '" title="rank ' + r.rank + ', step ' + steps[s] +
              ': ' + (r.busy_ms[s] || 0).toFixed(1) + ' ms, ' + ratio.toFixed(2) + 'x the median"></td>';
    }
    body += '</tr>';
  }
  table.innerHTML = body;
  // The pipeline timeline of the last traced step: one row per rank, a bar per event.
  if (run.timeline.length > 0) {
    const kinds = [...new Set(run.timeline.flatMap((r) => r.bars.map((b) => b[0])))];
    const timeline = new Chart(document.getElementById('timeline'), {
      type: 'bar',
      data: { labels: run.timeline.map((r) => 'rank ' + r.rank),
              datasets: kinds.map((k, i) => ({ label: k, backgroundColor: color(i),
                data: run.timeline.flatMap((r) => r.bars.filter((b) => b[0] === k)
                  .map((b) => ({ x: [b[2], b[3]], y: 'rank ' + r.rank }))) })) },
      options: { animation: false, indexAxis: 'y', grouped: false,
                 scales: { x: { title: { display: true, text: 'ms from the step\'s start' } } } }
    });
    register('timeline', timeline);
    let rows = '<tr><th>rank</th><th>stage</th><th>step, ms</th><th>bubble measured</th>' +
               '<th>bubble of the schedule</th></tr>';
    for (const r of run.timeline) {
      rows += '<tr><td>' + r.rank + '</td><td>' + r.stage + '</td><td>' + r.step_ms.toFixed(1) +
              '</td><td>' + (100 * r.bubble).toFixed(1) + '%</td><td>' +
              (r.theory === undefined ? '-' : (100 * r.theory).toFixed(1) + '%') + '</td></tr>';
    }
    document.getElementById('bubbles').innerHTML = rows;
  } else {
    document.getElementById('timeline-note').textContent =
        'No trace: lattice train --trace DIR records one, and lattice report --trace DIR draws it.';
  }
  // The planner's forecast next to the measured (lattice train --plan CLUSTER).
  const plan = run.plan;
  const planNote = document.getElementById('plan-note');
  if (plan && plan.rejected === undefined) {
    const bars = (id, labels, predicted, measured, y) => {
      const chart = new Chart(document.getElementById(id), {
        type: 'bar',
        data: { labels: labels, datasets: [
          { label: 'predicted', backgroundColor: color(0), data: predicted },
          { label: 'measured', backgroundColor: color(1), data: measured }] },
        options: { animation: false, scales: { y: { beginAtZero: true,
                   title: { display: true, text: y } } } }
      });
      register(id, chart);
    };
    const labels = [], predicted = [], measured = [];
    for (const st of plan.stages) {
      plan.quantities.forEach((q, i) => {
        labels.push((plan.stages.length > 1 ? 'stage ' + st.stage + ' ' : '') + q);
        predicted.push(st.predicted[i] / 1048576);
        measured.push(st.measured[i] / 1048576);
      });
    }
    bars('plan-memory', labels, predicted, measured, 'MiB, peak of a rank');
    bars('plan-time', plan.time.labels, plan.time.predicted, plan.time.measured, 'ms');
    let rows = '<tr><th></th><th>predicted</th><th>measured</th><th>predicted / measured</th></tr>';
    const row = (name, p, m, unit) => {
      rows += '<tr><td>' + name + '</td><td>' + p.toFixed(2) + ' ' + unit + '</td><td>' +
              m.toFixed(2) + ' ' + unit + '</td><td>' + (m > 0 ? (p / m).toFixed(3) : '-') +
              '</td></tr>';
    };
    labels.forEach((l, i) => row(l, predicted[i], measured[i], 'MiB'));
    plan.time.labels.forEach((l, i) => row(l, plan.time.predicted[i], plan.time.measured[i], 'ms'));
    document.getElementById('plan-table').innerHTML = rows;
    planNote.textContent = 'The planner on ' + plan.source + ', layout ' + plan.layout + '.';
  } else if (plan) {
    planNote.textContent = 'The planner could not price this layout: ' + plan.rejected;
  } else {
    planNote.textContent = 'No plan: lattice train --plan CLUSTER (a preset, or the profile ' +
        'lattice bench calibrate writes) records the planner\'s forecast of the run.';
  }
  document.getElementById('drawn').textContent = JSON.stringify(drawn);
  // Charts drawn with data: every dataset of each holds at least one point.
  const charts = Object.values(drawn).filter((sets) => sets.length > 0 &&
      sets.every((d) => d.data.length > 0)).length;
  document.body.dataset.charts = String(charts);
  // Everything the page shows it holds: the tests check that it fetched nothing.
  document.body.dataset.resources = String(performance.getEntriesByType('resource').length);
})();
)JS";

}  // namespace

std::string render_report(const RunMetrics& run, const ReportOptions& options) {
  const std::string chart_js = read_file(options.chart_js);
  const int64_t steps = run.records.empty() || run.records.front().empty()
                            ? 0
                            : run.records.front().back().at("step").get<int64_t>();
  std::string html;
  html += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  html += fmt::format("<title>lattice report: {}</title>\n", html_escape(options.title));
  html += R"(<style>
body { font-family: sans-serif; margin: 2em; max-width: 1100px; }
section { margin-bottom: 2.5em; } canvas { max-height: 320px; }
table.heatmap { border-collapse: collapse; } table.heatmap td { width: 4px; height: 14px; padding: 0; }
table.heatmap td:first-child { width: auto; padding-right: 6px; font-size: 12px; }
</style>
)";
  html += "<script>" + script_safe(chart_js) + "</script>\n";
  html +=
      "<script>window.addEventListener('error', (e) => { document.body.dataset.error = "
      "String(e.message); });</script>\n";
  html += "</head><body>\n";
  html += fmt::format("<h1>lattice report</h1><p>{}: {} rank(s), {} steps.</p>\n",
                      html_escape(options.title), run.records.size(), steps);
  const struct {
    const char* id;
    const char* heading;
  } sections[] = {{"loss", "Loss and validation loss"},
                  {"lr", "Learning rate"},
                  {"grad-norm", "Gradient norm"},
                  {"throughput", "Tokens per second"},
                  {"mfu", "Model FLOPs utilisation"},
                  {"memory", "Memory per rank, by category"},
                  {"memory-steps", "Memory of one rank over the steps, by category"},
                  {"memory-ranks", "Live memory of every rank over the steps"},
                  {"fragmentation", "Fragmentation of each rank's free arena space"},
                  {"bandwidth", "Bus bandwidth per group and collective"}};
  for (const auto& s : sections) {
    html += fmt::format("<section><h2>{}</h2><canvas id=\"{}\"></canvas>", s.heading, s.id);
    if (std::string(s.id) == "bandwidth") html += "<p id=\"bandwidth-note\"></p>";
    if (std::string(s.id) == "memory-steps") {
      html += "<label>rank <select id=\"memory-rank\"></select></label>";
    }
    html += "</section>\n";
  }
  html +=
      "<section><h2>Pipeline timeline of the last traced step</h2><canvas id=\"timeline\">"
      "</canvas><p id=\"timeline-note\"></p><table id=\"bubbles\"></table></section>\n";
  html +=
      "<section><h2>Busy time per rank and step (stragglers)</h2><p>Each cell: the rank's "
      "step without its waits, over the other ranks' median of that step; white at the "
      "median, red at 2.5× and above.</p><table class=\"heatmap\" id=\"heatmap\"></table>"
      "</section>\n";
  html +=
      "<section><h2>The plan against the run</h2><p id=\"plan-note\"></p><canvas "
      "id=\"plan-memory\"></canvas><canvas id=\"plan-time\"></canvas><table "
      "id=\"plan-table\"></table></section>\n";
  html += "<pre id=\"drawn\" hidden></pre>\n";
  nlohmann::json data = page_data(run);
  data["timeline"] =
      options.trace_dir.empty() ? nlohmann::json::array() : timeline_data(options.trace_dir, run);
  data["plan"] = plan_data(run);
  html += "<script type=\"application/json\" id=\"run-data\">" + script_safe(data.dump()) +
          "</script>\n";
  html += std::string("<script>") + kPageScript + "</script>\n</body></html>\n";
  return html;
}

}  // namespace lattice
