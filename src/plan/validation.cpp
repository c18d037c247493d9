#include "plan/validation.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"

namespace lattice::plan {
namespace {

constexpr double kKiB = 1024.0;

std::string format_value(const ValidationRow& row, double value) {
  if (row.is_time) return fmt::format("{:.2f} ms", value * 1e3);
  return fmt::format("{:.1f} KiB", value / kKiB);
}

std::string format_ratio(const ValidationRow& row) {
  if (row.measured <= 0) return row.predicted <= 0 ? "-" : "inf";
  return fmt::format("{:.3f}", row.ratio());
}

[[noreturn]] void bad_layout(const std::string& text) {
  LATTICE_THROW(
      ConfigError,
      "validation layout '{}' is not understood ---> HINT: write dp<N>, tp<N>, pp<N>, cp<N>, "
      "zero<K>, sp, a schedule (1f1b, gpipe, zb, v<N> for interleaved), rc-sel or "
      "rc-full and mb<N> (micro-batch) joined by '+' or nothing, e.g. dp1tp1, dp2, "
      "tp2+sp, dp2+zero1, pp2+gpipe, pp2+v2, pp2+rc-full",
      text);
}

}  // namespace

bool ValidationRow::flagged() const {
  if (predicted <= 0 && measured <= 0) return false;
  if (predicted <= 0 || measured <= 0) return true;
  const double r = predicted / measured;
  if (is_time) return std::max(r, 1.0 / r) > tolerance;
  return std::abs(r - 1.0) > tolerance;
}

int LayoutValidation::flagged_count() const {
  return int(std::count_if(rows.begin(), rows.end(),
                           [](const ValidationRow& row) { return row.flagged(); }));
}

LayoutValidation compare_layout(std::string name, const Layout& layout,
                                const MemoryBreakdown& memory, const TimeBreakdown& time,
                                const MeasuredRun& measured, const ValidationTolerance& tolerance) {
  LayoutValidation v;
  v.name = std::move(name);
  v.layout = layout;
  v.predicted_memory = memory;
  v.predicted_time = time;
  v.measured = measured;
  const double activations =
      memory.activations + memory.recompute_working + memory.embedding_activations + memory.logits;
  const double other = memory.communication_buffers + memory.zero3_gathered;
  const double total = memory.total - memory.fragmentation;
  auto bytes = [&](const char* quantity, double predicted, double measured_bytes, double tol) {
    v.rows.push_back({.quantity = quantity,
                      .predicted = predicted,
                      .measured = measured_bytes,
                      .is_time = false,
                      .tolerance = tol});
  };
  bytes("parameters", memory.parameters, measured.parameters, tolerance.model_states);
  bytes("gradients", memory.gradients, measured.gradients, tolerance.model_states);
  bytes("optimizer states", memory.optimizer_states, measured.optimizer_states,
        tolerance.model_states);
  bytes("activations", activations, measured.activations, tolerance.activations);
  bytes("other buffers", other, measured.other, tolerance.activations);
  bytes("total", total, measured.total, tolerance.total);
  v.rows.push_back({.quantity = "step time",
                    .predicted = time.step,
                    .measured = measured.step_seconds,
                    .is_time = true,
                    .tolerance = tolerance.time_factor});
  return v;
}

void add_peak_over_stages(LayoutValidation& v, double predicted, double measured,
                          double tolerance) {
  // Before the step-time row, which stays last.
  const auto at = v.rows.empty() || !v.rows.back().is_time ? v.rows.end() : v.rows.end() - 1;
  v.rows.insert(at, {.quantity = "peak over stages",
                     .predicted = predicted,
                     .measured = measured,
                     .is_time = false,
                     .tolerance = tolerance});
}

std::string validation_layout_name(const Layout& layout) {
  std::vector<std::string> parts;
  if (layout.dp > 1) parts.push_back(fmt::format("dp{}", layout.dp));
  if (layout.tp > 1) parts.push_back(fmt::format("tp{}", layout.tp));
  if (layout.pp > 1) parts.push_back(fmt::format("pp{}", layout.pp));
  if (layout.cp > 1) parts.push_back(fmt::format("cp{}", layout.cp));
  if (layout.ep > 1) parts.push_back(fmt::format("ep{}", layout.ep));
  if (parts.empty()) parts.push_back("dp1 tp1");
  if (layout.sequence_parallel) parts.push_back("sp");
  if (layout.zero > 0) parts.push_back(fmt::format("zero{}", layout.zero));
  if (layout.pp > 1) {
    if (layout.schedule == Schedule::kGpipe) parts.push_back("gpipe");
    if (layout.schedule == Schedule::kZeroBubbleH1) parts.push_back("zb");
    if (layout.schedule == Schedule::kInterleaved1F1B)
      parts.push_back(fmt::format("v{}", layout.virtual_stages));
  }
  if (layout.recompute == Recompute::kSelective) parts.push_back("rc-sel");
  if (layout.recompute == Recompute::kFull) parts.push_back("rc-full");
  return fmt::format("{}", fmt::join(parts, " "));
}

Layout parse_validation_layout(const std::string& text) {
  Layout layout;
  layout.micro_batch = 0;  // not given: the caller chooses
  bool dp_seen = false, tp_seen = false, pp_seen = false, cp_seen = false, ep_seen = false,
       schedule_seen = false;
  size_t i = 0;
  auto number = [&](size_t& at) -> int64_t {
    const size_t start = at;
    while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) ++at;
    if (at == start || at - start > 6) bad_layout(text);
    return std::stoll(text.substr(start, at - start));
  };
  auto starts = [&](std::string_view word) { return text.compare(i, word.size(), word) == 0; };
  auto schedule = [&](Schedule s, size_t length) {
    if (schedule_seen) bad_layout(text);
    schedule_seen = true;
    layout.schedule = s;
    i += length;
  };
  while (i < text.size()) {
    if (text[i] == '+' || text[i] == ' ' || text[i] == ',') {
      ++i;
    } else if (starts("dp") && !dp_seen) {
      i += 2;
      layout.dp = number(i);
      dp_seen = true;
    } else if (starts("tp") && !tp_seen) {
      i += 2;
      layout.tp = number(i);
      tp_seen = true;
    } else if (starts("pp") && !pp_seen) {
      i += 2;
      layout.pp = number(i);
      pp_seen = true;
    } else if (starts("cp") && !cp_seen) {
      i += 2;
      layout.cp = number(i);
      cp_seen = true;
    } else if (starts("ep") && !ep_seen) {
      i += 2;
      layout.ep = number(i);
      ep_seen = true;
    } else if (starts("zero")) {
      i += 4;
      layout.zero = int(number(i));
    } else if (starts("sp")) {
      i += 2;
      layout.sequence_parallel = true;
    } else if (starts("mb")) {
      i += 2;
      layout.micro_batch = number(i);
    } else if (starts("gpipe")) {
      schedule(Schedule::kGpipe, 5);
    } else if (starts("1f1b")) {
      schedule(Schedule::kOneFOneB, 4);
    } else if (starts("zb")) {
      schedule(Schedule::kZeroBubbleH1, starts("zb-h1") ? 5 : 2);
    } else if (starts("v") && i + 1 < text.size() &&
               std::isdigit(static_cast<unsigned char>(text[i + 1]))) {
      schedule(Schedule::kInterleaved1F1B, 1);
      layout.virtual_stages = number(i);
    } else if (starts("rc-sel")) {
      i += 6;
      layout.recompute = Recompute::kSelective;
    } else if (starts("rc-full")) {
      i += 7;
      layout.recompute = Recompute::kFull;
    } else {
      bad_layout(text);
    }
  }
  const bool sized =
      dp_seen || tp_seen || pp_seen || cp_seen || layout.recompute != Recompute::kNone;
  if (!sized || layout.dp < 1 || layout.tp < 1 || layout.pp < 1 || layout.cp < 1 || layout.ep < 1 ||
      layout.virtual_stages < 1 || (layout.micro_batch < 1 && text.find("mb") != std::string::npos))
    bad_layout(text);
  if (layout.sequence_parallel && layout.tp < 2) {
    LATTICE_THROW(ConfigError,
                  "validation layout '{}': sequence parallelism needs tp > 1 ---> HINT: write "
                  "tp2+sp",
                  text);
  }
  if (layout.zero > 0 && layout.dp * layout.cp < 2) {
    LATTICE_THROW(ConfigError,
                  "validation layout '{}': ZeRO shards over dp, which is 1 ---> HINT: write "
                  "dp2+zero1",
                  text);
  }
  if (schedule_seen && layout.pp < 2) {
    LATTICE_THROW(ConfigError,
                  "validation layout '{}': a pipeline schedule needs pp > 1 ---> HINT: write "
                  "pp2+gpipe",
                  text);
  }
  return layout;
}

std::string format_validation(const std::vector<LayoutValidation>& layouts) {
  std::string out = fmt::format("{:<24} {:<17} {:>14} {:>14} {:>8}  {}\n", "layout", "quantity",
                                "predicted", "measured", "ratio", "within");
  for (const LayoutValidation& v : layouts) {
    for (const ValidationRow& row : v.rows) {
      const std::string within =
          row.flagged() ? (row.is_time ? fmt::format("NO (factor > {:.2f})", row.tolerance)
                                       : fmt::format("NO (> {:.0f}%)", row.tolerance * 100.0))
                        : (row.is_time ? fmt::format("yes (factor {:.2f})", row.tolerance)
                                       : fmt::format("yes ({:.0f}%)", row.tolerance * 100.0));
      out += fmt::format("{:<24} {:<17} {:>14} {:>14} {:>8}  {}\n", v.name, row.quantity,
                         format_value(row, row.predicted), format_value(row, row.measured),
                         format_ratio(row), within);
    }
  }
  return out;
}

nlohmann::json to_json(const LayoutValidation& v) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ValidationRow& row : v.rows) {
    rows.push_back({{"quantity", row.quantity},
                    {"unit", row.is_time ? "s" : "bytes"},
                    {"predicted", row.predicted},
                    {"measured", row.measured},
                    {"ratio", row.ratio()},
                    {"tolerance", row.tolerance},
                    {"flagged", row.flagged()}});
  }
  return {{"layout", v.name},
          {"dp", v.layout.dp},
          {"tp", v.layout.tp},
          {"pp", v.layout.pp},
          {"virtual_stages", v.layout.virtual_stages},
          {"schedule", schedule_kind_name(v.layout.schedule)},
          {"recompute", recompute_name(v.layout.recompute)},
          {"stage", v.stage},
          {"zero", v.layout.zero},
          {"sequence_parallel", v.layout.sequence_parallel},
          {"micro_batch", v.layout.micro_batch},
          {"rows", rows},
          {"flagged", v.flagged_count()}};
}

}  // namespace lattice::plan
