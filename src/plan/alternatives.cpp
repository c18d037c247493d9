#include "plan/alternatives.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace lattice::plan {
namespace {

struct Candidate {
  std::string change;
  Layout layout;
};

// Keeps the device count by moving the factor into or out of dp; false when dp cannot absorb it.
bool rebalance(Layout& layout, int64_t old_size, int64_t new_size) {
  const int64_t product = layout.dp * old_size;
  if (product % new_size != 0) return false;
  layout.dp = product / new_size;
  return true;
}

std::vector<Candidate> neighbours(const Layout& best, int64_t devices, bool sparse) {
  std::vector<Candidate> out;
  auto add = [&](std::string change, Layout l) {
    if (l.zero > 0 && l.dp == 1) l.zero = 0;
    if (l.pp == 1) l.schedule = Schedule::kOneFOneB, l.virtual_stages = 1;
    if (l.tp == 1) l.sequence_parallel = false;
    // A split belongs to its p·v: another pipeline shape takes its own (even or balanced).
    if (int64_t(l.layers_per_chunk.size()) != l.pp * l.virtual_stages) l.layers_per_chunk.clear();
    if (!(l == best)) out.push_back({std::move(change), l});
  };
  for (int64_t tp : {best.tp * 2, best.tp / 2}) {
    Layout l = best;
    if (tp < 1 || !rebalance(l, best.tp, tp)) continue;
    l.tp = tp;
    add(fmt::format("tp {} (dp {})", tp, l.dp), l);
  }
  for (int64_t pp : {best.pp * 2, best.pp / 2}) {
    Layout l = best;
    if (pp < 1 || !rebalance(l, best.pp, pp)) continue;
    l.pp = pp;
    add(fmt::format("pp {} (dp {})", pp, l.dp), l);
  }
  if (best.dp > 1) {
    for (int zero = 0; zero <= 3; ++zero) {
      Layout l = best;
      l.zero = zero;
      add(fmt::format("zero {}", zero), l);
    }
  }
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    Layout l = best;
    l.recompute = r;
    add(fmt::format("recompute {}", recompute_name(r)), l);
  }
  if (best.tp > 1) {
    Layout l = best;
    l.sequence_parallel = !best.sequence_parallel;
    add(l.sequence_parallel ? "sequence parallel on" : "sequence parallel off", l);
  }
  if (best.pp > 1) {
    for (Schedule s : {Schedule::kOneFOneB, Schedule::kInterleaved1F1B, Schedule::kGpipe,
                       Schedule::kZeroBubbleH1}) {
      Layout l = best;
      l.schedule = s;
      l.virtual_stages =
          s == Schedule::kInterleaved1F1B ? std::max<int64_t>(2, best.virtual_stages) : 1;
      add(fmt::format("schedule {}", schedule_kind_name(s)), l);
    }
  }
  if (sparse) {  // the experts over more or fewer of the dp ranks, or none
    for (int64_t ep : {best.ep * 2, best.ep / 2, int64_t(1)}) {
      if (ep < 1) continue;
      Layout l = best;
      l.ep = ep;
      add(fmt::format("ep {}", ep), l);
    }
  }
  for (int64_t b : {best.micro_batch * 2, best.micro_batch / 2}) {
    if (b < 1) continue;
    Layout l = best;
    l.micro_batch = b;
    add(fmt::format("micro-batch {}", b), l);
  }
  Layout plain;
  plain.dp = devices;
  add("data parallel only", plain);
  return out;
}

std::string verdict(const Evaluation& best, const Evaluation& alt, const ClusterSpec& cluster) {
  if (!alt.feasible()) {
    return fmt::format("rejected ({}): {}", reject_reason_name(alt.rejection->reason),
                       alt.rejection->message);
  }
  const TimeBreakdown& a = alt.time;
  const TimeBreakdown& b = best.time;
  const double slowdown = a.step / b.step;
  if (slowdown < 1.005) {
    return slowdown < 0.995
               ? fmt::format("{:.0f}% faster, but outside the constraints of the search",
                             (1.0 - slowdown) * 100.0)
               : "ties with the recommendation (within 0.5%)";
  }
  struct Delta {
    const char* part;
    double seconds;
  };
  const Delta deltas[] = {
      {"compute", (a.forward + a.backward) - (b.forward + b.backward)},
      {"recompute", a.recompute - b.recompute},
      {"tp", a.tp_communication - b.tp_communication},
      {"pp", a.pp_communication - b.pp_communication},
      {"bubble", a.bubble - b.bubble},
      {"dp", a.dp_communication - b.dp_communication},
      {"ep", a.ep_communication - b.ep_communication},
      {"optimizer", a.optimizer - b.optimizer},
  };
  const Delta worst = *std::max_element(std::begin(deltas), std::end(deltas),
                                        [](auto x, auto y) { return x.seconds < y.seconds; });
  const std::string cost = fmt::format("{:.0f}% slower: ", (slowdown - 1.0) * 100.0);
  const double ms = worst.seconds * 1e3;
  const std::string_view part = worst.part;
  if (part == "tp") {
    if (a.tp_link == Transport::kInterNode && b.tp_link == Transport::kIntraNode) {
      return cost + fmt::format(
                        "tensor-parallel collectives cross nodes over {} (+{:.1f} ms) "
                        "---> keep tp inside a node and use pp instead",
                        cluster.inter_node.name, ms);
    }
    return cost + fmt::format("more tensor-parallel collectives per layer (+{:.1f} ms)", ms);
  }
  if (part == "bubble") {
    return cost + fmt::format(
                      "pipeline bubble {:.0f}% of compute instead of {:.0f}% "
                      "(+{:.1f} ms) ---> more micro-batches or interleaving",
                      a.bubble_ratio * 100, b.bubble_ratio * 100, ms);
  }
  if (part == "dp") {
    return cost + fmt::format("data-parallel traffic the backward cannot hide (+{:.1f} ms{})", ms,
                              a.dp_link == Transport::kInterNode ? ", between nodes" : "");
  }
  if (part == "ep") {
    return cost + fmt::format("the experts' all-to-alls (+{:.1f} ms{})", ms,
                              a.ep_link == Transport::kInterNode
                                  ? fmt::format(", between nodes over {}", cluster.inter_node.name)
                                  : "");
  }
  if (part == "recompute") return cost + fmt::format("recomputation (+{:.1f} ms)", ms);
  if (part == "pp") return cost + fmt::format("pipeline sends (+{:.1f} ms)", ms);
  if (part == "optimizer") {
    return cost + fmt::format("the optimizer updates a larger shard (+{:.1f} ms)", ms);
  }
  return cost + fmt::format(
                    "more compute time (+{:.1f} ms): smaller GEMMs run less "
                    "efficiently, or more element-wise memory traffic",
                    ms);
}

}  // namespace

std::vector<Alternative> explain_alternatives(const TrainingSetup& setup,
                                              const Evaluation& recommended) {
  std::vector<Alternative> out;
  for (const Candidate& c : neighbours(recommended.layout, setup.devices, setup.model.moe())) {
    Alternative alt;
    alt.change = c.change;
    alt.evaluation = evaluate(setup, c.layout);
    if (alt.evaluation.feasible()) alt.slowdown = alt.evaluation.time.step / recommended.time.step;
    alt.verdict = verdict(recommended, alt.evaluation, setup.cluster);
    out.push_back(std::move(alt));
  }
  return out;
}

}  // namespace lattice::plan
