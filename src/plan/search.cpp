#include "plan/search.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace lattice::plan {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

std::vector<int64_t> choices(const std::optional<int64_t>& fixed, std::vector<int64_t> all) {
  if (fixed) return {*fixed};
  return all;
}

// The objective's best first (by default the fastest); among equals the one that moves fewer
// bytes (no ZeRO-3 when its gathers hide completely), then the one with less memory.
bool better(const Evaluation& a, const Evaluation& b, const TrainingSetup& setup,
            Objective objective) {
  const double ka = objective_per_token(objective, setup, a.time);
  const double kb = objective_per_token(objective, setup, b.time);
  if (ka != kb) return ka < kb;
  auto traffic = [](const TimeBreakdown& t) {
    return t.dp_communication_total + t.tp_communication + t.pp_communication + t.cp_communication +
           t.ep_communication;
  };
  if (traffic(a.time) != traffic(b.time)) return traffic(a.time) < traffic(b.time);
  return a.memory.total < b.memory.total;
}

class Ranking {
 public:
  Ranking(const TrainingSetup& setup, const SearchConstraints& constraints, SearchResult& result)
      : setup_(setup), constraints_(constraints), result_(result) {}

  void judge(const Layout& layout) {
    ++result_.evaluated;
    Evaluation e = evaluate(setup_, layout);
    if (!e.feasible()) {
      ++result_.rejected[size_t(e.rejection->reason)];
      if (!result_.first_rejected) result_.first_rejected = e;
      if (e.rejection->reason == RejectReason::kMemory &&
          (!result_.closest_to_fitting ||
           e.memory.total / e.memory.capacity < result_.closest_to_fitting->memory.total /
                                                    result_.closest_to_fitting->memory.capacity)) {
        result_.closest_to_fitting = e;
      }
      return;
    }
    ++result_.feasible;
    auto& ranked = result_.ranked;
    auto before = [this](const Evaluation& a, const Evaluation& b) {
      return better(a, b, setup_, constraints_.objective);
    };
    if (int(ranked.size()) == constraints_.top_k && !before(e, ranked.back())) return;
    ranked.insert(std::upper_bound(ranked.begin(), ranked.end(), e, before), std::move(e));
    if (int(ranked.size()) > constraints_.top_k) ranked.pop_back();
  }

 private:
  const TrainingSetup& setup_;
  const SearchConstraints& constraints_;
  SearchResult& result_;
};

// The layers per chunk of the (pp, v) layouts: the constraints' split where its size is p·v,
// else default_split (computed once per pair here, not per layout and stage).
std::vector<int64_t> pipeline_split(const TrainingSetup& setup, const SearchConstraints& c,
                                    int64_t pp, int64_t v) {
  const int64_t chunks = pp * v;
  if (chunks <= 1) return {};
  if (int64_t(c.layers_per_chunk.size()) == chunks) return c.layers_per_chunk;
  return default_split(setup.model, pp, v);
}

}  // namespace

SearchResult search_layouts(const TrainingSetup& setup, const SearchConstraints& c) {
  validate(setup);
  if (c.recompute.empty() || c.zero_stages.empty() || c.schedules.empty() || c.top_k < 1) {
    LATTICE_THROW(ConfigError,
                  "the search constraints allow no layout (an empty list of "
                  "recompute modes, ZeRO stages or schedules) ---> HINT: allow at least one of "
                  "each");
  }
  for (const auto& [fixed, name] :
       {std::pair{c.dp, "dp"}, {c.tp, "tp"}, {c.pp, "pp"}, {c.cp, "cp"}}) {
    if (fixed && (*fixed < 1 || setup.devices % *fixed != 0)) {
      LATTICE_THROW(ConfigError,
                    "{} = {} does not divide the {} devices ---> HINT: choose a "
                    "divisor of {}",
                    name, *fixed, setup.devices, setup.devices);
    }
  }
  if (c.ep &&
      (*c.ep < 1 || (setup.model.moe() ? setup.model.n_experts % *c.ep != 0 : *c.ep != 1))) {
    LATTICE_THROW(ConfigError,
                  "ep = {} does not divide model '{}''s {} experts a layer ---> HINT: {}", *c.ep,
                  setup.model.name, setup.model.n_experts,
                  setup.model.moe() ? "choose a divisor of the experts (and of dp)"
                                    : "expert parallelism needs a mixture-of-experts model");
  }
  if (!c.layers_per_chunk.empty()) {
    int64_t sum = 0;
    for (int64_t n : c.layers_per_chunk) sum += n;
    // Per layout, check_layout judges the split against its pp; here only what no pp can mend.
    if (!valid_layer_split(c.layers_per_chunk, setup.model.n_layers, 1,
                           setup.runtime != Runtime::kLattice)) {
      LATTICE_THROW(ConfigError,
                    "layers per chunk {} sum to {} but the model has {} layers ---> HINT: give "
                    "p·v counts of at least one layer summing to {}",
                    describe_layer_counts(c.layers_per_chunk), sum, setup.model.n_layers,
                    setup.model.n_layers);
    }
  }
  // Under flash attention selective recompute stores and computes exactly what no recompute
  // does (activation_memory.h); judging both would list every layout twice.
  std::vector<Recompute> recomputes = c.recompute;
  const bool none_allowed =
      std::find(recomputes.begin(), recomputes.end(), Recompute::kNone) != recomputes.end();
  if (setup.flash_attention && none_allowed) {
    std::erase(recomputes, Recompute::kSelective);
  }

  SearchResult result;
  Ranking ranking(setup, c, result);
  const int64_t max_pp = c.max_pp > 0 ? c.max_pp : setup.model.n_layers;

  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> split_cache;
  // Context-parallel sizes: the fixed one, else those that cut the sequence into 2·cp chunks
  // of at least min_cp_positions / 2 positions.
  std::vector<int64_t> cps;
  for (int64_t cp : choices(c.cp, divisors(setup.devices))) {
    // Sparse layers route whole sequences: cp only where fixed (and then rejected).
    if (c.cp || cp == 1 ||
        (!setup.model.moe() && setup.seq_len % (2 * cp) == 0 &&
         setup.seq_len / cp >= c.min_cp_positions))
      cps.push_back(cp);
  }
  for (int64_t cp : cps)
    for (int64_t tp : choices(c.tp, divisors(setup.devices / cp))) {
      if (setup.devices % (tp * cp) != 0) continue;
      for (int64_t pp : choices(c.pp, divisors(setup.devices / (tp * cp)))) {
        if (pp > max_pp || setup.devices % (tp * pp * cp) != 0) continue;
        const int64_t dp = setup.devices / (tp * pp * cp);
        if (c.dp && *c.dp != dp) continue;

        std::vector<int64_t> micro_batches;
        if (c.micro_batch) {
          micro_batches = {*c.micro_batch};
        } else if (setup.global_batch % dp != 0) {
          micro_batches = {1};  // judged, and rejected for the batch
        } else {
          for (int64_t b : divisors(setup.global_batch / dp)) {
            if (b <= c.max_micro_batch) micro_batches.push_back(b);
          }
        }
        // (schedule, v) pairs: one trivial schedule without a pipeline.
        std::vector<std::pair<Schedule, int64_t>> schedules;
        if (pp == 1) {
          schedules.push_back({Schedule::kOneFOneB, c.virtual_stages.value_or(1)});
        } else {
          for (Schedule s : c.schedules) {
            if (s != Schedule::kInterleaved1F1B) {
              if (!c.virtual_stages || *c.virtual_stages == 1) schedules.push_back({s, 1});
              continue;
            }
            for (int64_t v = 2; v <= c.max_virtual_stages; ++v) {
              if (c.virtual_stages && *c.virtual_stages != v) continue;
              // Every chunk needs a layer; where p·v does not divide them, the balanced partition
              // (or the given layers_per_chunk) places them.
              if (!c.virtual_stages && pp * v > setup.model.n_layers) continue;
              if (c.even_splits_only && (pp <= 2 || setup.model.n_layers % (pp * v) != 0)) continue;
              schedules.push_back({s, v});
            }
          }
          // Nothing consistent (v > 1 with a plain schedule, no v dividing l): judged, rejected.
          if (schedules.empty())
            schedules.push_back({c.schedules.front(), c.virtual_stages.value_or(2)});
        }
        std::vector<int> zeros = c.zero_stages;
        if (dp * cp == 1) zeros = {*std::min_element(zeros.begin(), zeros.end())};  // no replicas
        // Expert parallelism: sizes dividing both dp and the experts (judged with every ZeRO
        // stage; check_layout rejects ZeRO-2/3 with ep).
        std::vector<int64_t> eps;
        if (c.ep) {
          eps = {*c.ep};
        } else if (setup.model.moe()) {
          for (int64_t ep : divisors(dp)) {
            if (setup.model.n_experts % ep == 0) eps.push_back(ep);
          }
        } else {
          eps = {1};
        }
        std::vector<bool> sps = {false};
        if (c.sequence_parallel)
          sps = {*c.sequence_parallel};
        else if (tp > 1)
          sps = {false, true};

        // The partition depends on (pp, v) only and is a search of its own: once per pair.
        std::vector<std::vector<int64_t>> splits;
        for (const auto& entry : schedules) {
          const std::pair<int64_t, int64_t> key{pp, entry.second};
          auto found = split_cache.find(key);
          if (found == split_cache.end())
            found = split_cache.emplace(key, pipeline_split(setup, c, pp, entry.second)).first;
          splits.push_back(found->second);
        }
        for (int64_t b : micro_batches) {
          for (size_t k = 0; k < schedules.size(); ++k) {
            const auto& [schedule, v] = schedules[k];
            const std::vector<int64_t>& split = splits[k];
            for (int zero : zeros) {
              for (Recompute recompute : recomputes) {
                for (bool sp : sps) {
                  for (int64_t ep : eps) {
                    ranking.judge({.dp = dp,
                                   .tp = tp,
                                   .pp = pp,
                                   .virtual_stages = v,
                                   .zero = zero,
                                   .micro_batch = b,
                                   .recompute = recompute,
                                   .sequence_parallel = sp,
                                   .schedule = schedule,
                                   .layers_per_chunk = split,
                                   .cp = cp,
                                   .ep = ep});
                  }
                }
              }
            }
          }
        }
      }
    }
  return result;
}

}  // namespace lattice::plan
