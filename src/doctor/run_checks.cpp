#include "doctor/run_checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>

#include "core/error.h"
#include "core/statistics.h"
#include "run/traced_steps.h"

namespace lattice::doctor {

namespace fs = std::filesystem;

namespace {

// A grad norm this many times the median of the steps before it is a spike.
constexpr double kSpikeFactor = 10;
// A rank this many times the median step of the others, this many steps in a row, straggles.
constexpr double kStragglerFactor = 1.5;
// Live bytes that grew on every one of this many steps in a row grow without bound.
constexpr int kGrowthSteps = 10;
constexpr double kFragmentation = 0.5;
constexpr double kExposedShare = 0.3;
// Mixture of experts, over a run's last steps: an expert below this share of its layer's mean
// load is starved (the router collapsed), a rank whose experts take this many times the median
// rank's tokens computes for the others.
constexpr size_t kExpertWindow = 10;
constexpr double kStarvedShare = 0.1;
constexpr double kRankLoadFactor = 1.5;

// A number of a record; NaN for null, which is how JSON writers store NaN and infinity.
double number(const nlohmann::json& record, const char* key) {
  const nlohmann::json& value = record.at(key);
  return value.is_number() ? value.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

CheckResult result(const char* id, const char* title) {
  CheckResult r;
  r.id = id;
  r.title = title;
  return r;
}

CheckResult check_losses(const RunMetrics& run) {
  CheckResult r = result("run-loss", "Losses and grad norms of the run");
  int64_t steps = 0;
  for (size_t rank = 0; rank < run.records.size(); ++rank) {
    std::vector<double> norms;
    for (const nlohmann::json& j : run.records[rank]) {
      const int64_t step = j.at("step").get<int64_t>();
      const double loss = number(j, "loss");
      const double norm = number(j, "grad_norm");
      steps = std::max(steps, step);
      if (!std::isfinite(loss) || !std::isfinite(norm)) {
        r.verdict = Verdict::kFail;
        r.saw = fmt::format("step {} on rank {}: loss {}, grad norm {}: the run diverged", step,
                            rank, loss, norm);
        r.fix =
            "resume from the checkpoint before it with a lower optim.lr (or a longer "
            "optim.warmup_steps), and keep optim.grad_clip on";
        return r;
      }
      if (norms.size() >= 5) {
        const double typical = median(norms);
        if (typical > 0 && norm > kSpikeFactor * typical && r.verdict != Verdict::kWarn) {
          r.verdict = Verdict::kWarn;
          r.saw = fmt::format(
              "step {} on rank {}: grad norm {:.4g}, {:.0f}× the median {:.4g} of the steps "
              "before: a loss spike (clipped to optim.grad_clip)",
              step, rank, norm, norm / typical, typical);
          r.fix = "look at the data of that step; a lower optim.lr or more warm-up steps";
        }
      }
      norms.push_back(norm);
    }
  }
  if (r.verdict == Verdict::kWarn) return r;
  r.verdict = Verdict::kPass;
  r.saw = fmt::format("{} steps on {} rank(s): finite losses and grad norms, no spike", steps,
                      run.records.size());
  return r;
}

CheckResult check_stragglers(const RunMetrics& run) {
  CheckResult r = result("run-stragglers", "Stragglers");
  if (run.records.size() < 2) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "one rank: nobody to straggle behind";
    return r;
  }
  // step -> each rank's busy ms (StepMetrics::busy_ms: the step without its waits).
  std::map<int64_t, std::map<size_t, double>> by_step;
  for (size_t rank = 0; rank < run.records.size(); ++rank) {
    for (const nlohmann::json& j : run.records[rank]) {
      by_step[j.at("step").get<int64_t>()][rank] = j.at("parts").at("busy_ms").get<double>();
    }
  }
  std::vector<StragglerStreak> streaks(run.records.size());
  for (const auto& [step, times] : by_step) {
    if (times.size() < run.records.size()) continue;  // a step not every rank has finished
    for (const auto& [rank, ms] : times) {
      std::vector<double> others;
      for (const auto& [other, their_ms] : times)
        if (other != rank) others.push_back(their_ms);
      const double typical = median(others);
      if (!streaks[rank].observe(ms, typical, kStragglerFactor)) continue;
      r.verdict = Verdict::kWarn;
      r.saw = fmt::format(
          "rank {} was busy {:.1f} ms at step {} against a median of {:.1f} ms on the others "
          "({:.1f}×), for {} steps in a row: every rank waits for it",
          rank, ms, step, typical, ms / typical, streaks[rank].length());
      r.fix = "lattice doctor --env shows each rank's cores; look for another load on them";
      r.figures = {{"rank", rank}, {"step", step}, {"ms", ms}, {"others_median_ms", typical}};
      return r;
    }
  }
  r.verdict = Verdict::kPass;
  r.saw = fmt::format(
      "no rank's compute above {}× the others' median for {} steps in a row ({} "
      "steps)",
      kStragglerFactor, StragglerStreak::kSteps, by_step.size());
  return r;
}

CheckResult check_memory_growth(const RunMetrics& run) {
  CheckResult r = result("run-memory", "Memory of the run");
  double worst_fragmentation = 0;
  for (size_t rank = 0; rank < run.records.size(); ++rank) {
    int growing = 0;
    double previous = -1;
    for (const nlohmann::json& j : run.records[rank]) {
      const nlohmann::json& memory = j.at("memory");
      const double live = memory.at("live_bytes").get<double>();
      growing = previous >= 0 && live > previous ? growing + 1 : 0;
      previous = live;
      worst_fragmentation = std::max(worst_fragmentation, memory.at("fragmentation").get<double>());
      if (growing >= kGrowthSteps) {
        r.verdict = Verdict::kWarn;
        r.saw = fmt::format(
            "rank {}'s live bytes grew on each of {} steps in a row, to {:.1f} MiB at step {}: "
            "something is kept every step",
            rank, growing, live / double(1 << 20), j.at("step").get<int64_t>());
        r.fix = "the per-category bytes in its metrics name what grows";
        return r;
      }
    }
  }
  if (worst_fragmentation > kFragmentation) {
    r.verdict = Verdict::kWarn;
    r.saw = fmt::format(
        "an arena's free space is {:.0f}% fragmented: a large allocation may "
        "not fit although the bytes are free",
        100 * worst_fragmentation);
    r.fix = "allocations of changing sizes (eval batches, resharding): keep shapes fixed";
    return r;
  }
  r.verdict = Verdict::kPass;
  r.saw = fmt::format("no rank's live bytes grow step after step; fragmentation at most {:.0f}%",
                      100 * worst_fragmentation);
  return r;
}

CheckResult check_exposed_comm(const RunMetrics& run) {
  CheckResult r = result("run-comm", "Communication the steps did not hide");
  double exposed = 0, total = 0;
  for (const auto& records : run.records) {
    for (const nlohmann::json& j : records) {
      const nlohmann::json& parts = j.at("parts");
      exposed +=
          parts.at("exposed_comm_ms").get<double>() + parts.at("pipeline_idle_ms").get<double>();
      total += j.at("ms").get<double>();
    }
  }
  const double share = total > 0 ? exposed / total : 0;
  r.figures = {{"exposed_share", share}};
  if (share > kExposedShare) {
    r.verdict = Verdict::kWarn;
    r.saw = fmt::format(
        "{:.0f}% of the steps' time waited for gradient reduction or pipeline "
        "transfers",
        100 * share);
    r.fix =
        "smaller --bucket-mb so reduction starts earlier, more micro-batches for the "
        "pipeline, or fewer ranks per link (lattice plan explains the trade)";
    return r;
  }
  r.verdict = Verdict::kPass;
  r.saw = fmt::format("{:.1f}% of the steps' time waited for communication", 100 * share);
  return r;
}

}  // namespace

// A stage's measured bubble this far above its schedule's is no longer the schedule's doing.
constexpr double kBubbleExcess = 0.15;

CheckResult check_bubble(const RunMetrics& run, std::filesystem::path trace_dir) {
  CheckResult r = result("run-bubble", "Pipeline bubble against the schedule's");
  if (run.info.value("pp", 1) <= 1) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "not a pipeline run (pp = 1 in metrics/run.json)";
    return r;
  }
  if (trace_dir.empty()) trace_dir = run.info.value("trace", std::string());
  const std::vector<TracedStep> steps =
      trace_dir.empty() ? std::vector<TracedStep>{} : last_traced_steps(trace_dir, run);
  if (steps.empty()) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = trace_dir.empty()
                ? std::string("the run was not traced")
                : fmt::format("no rank's trace under {} holds a step", trace_dir.string());
    return r;
  }
  const TracedStep* worst = nullptr;
  double worst_excess = -1;
  std::vector<std::string> per_rank;
  for (const TracedStep& step : steps) {
    const double theory = step.theory.value_or(0.0);
    per_rank.push_back(fmt::format("rank {} (stage {}) {:.1f}% vs {:.1f}%", step.rank, step.stage,
                                   100 * step.bubble, 100 * theory));
    if (step.bubble - theory > worst_excess) {
      worst_excess = step.bubble - theory;
      worst = &step;
    }
  }
  const double theory = worst->theory.value_or(0.0);
  r.figures = {{"rank", worst->rank},
               {"stage", worst->stage},
               {"measured_bubble", worst->bubble},
               {"schedule_bubble", theory},
               {"ranks", steps.size()}};
  const std::string seen =
      fmt::format("the last traced step's bubble, measured against the {} schedule's: {}",
                  run.info.value("schedule", std::string("?")), fmt::join(per_rank, ", "));
  if (worst_excess > kBubbleExcess) {
    r.verdict = Verdict::kWarn;
    r.saw = fmt::format(
        "rank {} (stage {}) idled {:.1f}% of its step where the schedule leaves {:.1f}%: its "
        "neighbours keep it waiting; {}",
        worst->rank, worst->stage, 100 * worst->bubble, 100 * theory, seen);
    r.fix =
        "lattice report RUN_DIR draws the step's timeline: a slow stage (move layers off it with "
        "parallel.layers_per_chunk), a slow link between stages (lattice doctor's network "
        "check), or too few micro-batches (batch.micro_batches)";
    return r;
  }
  r.verdict = Verdict::kPass;
  r.saw = seen;
  return r;
}

namespace {

// The tokens each rank's experts received over the window: under expert parallelism (run.json's
// "ep") rank j of an ep group (ep consecutive dp ranks of one pp, tp position) holds experts
// [j·E/ep, (j+1)·E/ep) and computes what every rank of its group routed to them; without it a
// rank computes its own tokens on all experts. routed[rank][e]: tokens the rank routed to expert e.
std::vector<double> received_tokens(const RunMetrics& run,
                                    const std::vector<std::vector<double>>& routed) {
  const int64_t ep = run.info.value("ep", int64_t(1));
  std::vector<nlohmann::json> at(routed.size());
  for (size_t rank = 0; rank < routed.size(); ++rank) {
    if (!run.records[rank].empty())
      at[rank] = run.records[rank].front().value("at", nlohmann::json());
  }
  auto coordinate = [&](size_t rank, const char* axis) {
    return at[rank].is_object() ? at[rank].value(axis, int64_t(0)) : int64_t(0);
  };
  std::vector<double> received(routed.size(), 0.0);
  for (size_t rank = 0; rank < routed.size(); ++rank) {
    const int64_t experts = int64_t(routed[rank].size());
    if (ep <= 1 || !at[rank].is_object() || experts % ep != 0) {
      for (double n : routed[rank]) received[rank] += n;
      continue;
    }
    const int64_t dp = coordinate(rank, "dp");
    const int64_t per_rank = experts / ep, first = dp % ep * per_rank;
    for (size_t peer = 0; peer < routed.size(); ++peer) {
      const bool same_group = coordinate(peer, "pp") == coordinate(rank, "pp") &&
                              coordinate(peer, "tp") == coordinate(rank, "tp") &&
                              coordinate(peer, "dp") / ep == dp / ep;
      if (!same_group || int64_t(routed[peer].size()) != experts) continue;
      for (int64_t e = first; e < first + per_rank; ++e) received[rank] += routed[peer][size_t(e)];
    }
  }
  return received;
}

// Mixture of experts: the routers over the run's last steps. Loads are summed over the ranks
// (each routes its own tokens) and over the window, per layer.
CheckResult check_experts(const RunMetrics& run) {
  CheckResult r = result("run-experts", "Tokens per expert (mixture of experts)");
  // (layer) -> tokens per expert over the window, all ranks; per rank: tokens it routed to each
  // expert (all layers).
  std::map<int64_t, std::vector<double>> loads;
  std::vector<std::vector<double>> routed;
  int64_t first_step = 0, last_step = 0;
  for (const auto& records : run.records) {
    std::vector<double>& mine = routed.emplace_back();
    const size_t from = records.size() > kExpertWindow ? records.size() - kExpertWindow : 0;
    for (size_t i = from; i < records.size(); ++i) {
      const nlohmann::json& j = records[i];
      if (!j.contains("experts")) continue;
      const int64_t step = j.at("step").get<int64_t>();
      first_step = first_step == 0 ? step : std::min(first_step, step);
      last_step = std::max(last_step, step);
      for (const nlohmann::json& layer : j.at("experts")) {
        const auto tokens = layer.at("tokens").get<std::vector<int64_t>>();
        std::vector<double>& sum = loads[layer.at("layer").get<int64_t>()];
        sum.resize(tokens.size(), 0.0);
        mine.resize(std::max(mine.size(), tokens.size()), 0.0);
        for (size_t e = 0; e < tokens.size(); ++e) {
          sum[e] += double(tokens[e]);
          mine[e] += double(tokens[e]);
        }
      }
    }
  }
  if (loads.empty()) {
    r.saw = "no expert loads in the metrics: a dense model";
    return r;
  }
  r.verdict = Verdict::kPass;
  double worst = 0;
  for (const auto& [layer, tokens] : loads) {
    double sum = 0, most = 0, least = std::numeric_limits<double>::infinity();
    size_t starved = 0;
    for (size_t e = 0; e < tokens.size(); ++e) {
      sum += tokens[e];
      most = std::max(most, tokens[e]);
      if (tokens[e] < least) {
        least = tokens[e];
        starved = e;
      }
    }
    const double mean = sum / double(tokens.size());
    worst = std::max(worst, mean > 0 ? most / mean : 0.0);
    if (mean > 0 && least < kStarvedShare * mean && r.verdict == Verdict::kPass) {
      r.verdict = Verdict::kWarn;
      r.saw = fmt::format(
          "steps {}-{}: layer {}'s expert {} received {:.0f} tokens, {:.1f}% of the mean {:.0f} "
          "(loads {}): routing collapsed onto the other experts",
          first_step, last_step, layer, starved, least, 100 * least / mean, mean, tokens);
      r.fix =
          "raise model.moe_aux_loss (the load-balancing loss, e.g. 0.01 -> 0.05), or lower "
          "optim.lr in the first steps; model.capacity_factor caps an expert's tokens";
    }
  }
  const std::vector<double> rank_totals = received_tokens(run, routed);
  const double typical = median(rank_totals);
  for (size_t rank = 0; rank < rank_totals.size() && r.verdict == Verdict::kPass; ++rank) {
    if (typical > 0 && rank_totals[rank] > kRankLoadFactor * typical) {
      r.verdict = Verdict::kWarn;
      r.saw = fmt::format(
          "steps {}-{}: rank {}'s experts received {:.0f} tokens, {:.1f}× the median rank's "
          "{:.0f}: that rank computes for the others",
          first_step, last_step, rank, rank_totals[rank], rank_totals[rank] / typical, typical);
      r.fix = "raise model.moe_aux_loss so that tokens spread over the experts (and their ranks)";
    }
  }
  if (r.verdict == Verdict::kPass) {
    r.saw = fmt::format(
        "steps {}-{}: {} sparse layers, every expert above {:.0f}% of its layer's mean load, "
        "busiest expert {:.2f}× the mean",
        first_step, last_step, loads.size(), 100 * kStarvedShare, worst);
  }
  return r;
}

}  // namespace

std::vector<CheckResult> check_run(const RunMetrics& run, const std::filesystem::path& trace_dir) {
  return {check_losses(run),       check_stragglers(run),        check_memory_growth(run),
          check_exposed_comm(run), check_bubble(run, trace_dir), check_experts(run)};
}

}  // namespace lattice::doctor
