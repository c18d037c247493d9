// The search over layouts: every (dp, tp, pp, v, zero, micro-batch, recompute, sp, schedule, ep)
// consistent with the device count and the constraints, judged by evaluate(), the feasible
// ones ranked by predicted tokens/s.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "plan/energy_cost.h"
#include "plan/evaluation.h"

namespace lattice::plan {

// Unset fields are searched; set ones are fixed. Fixing every dimension evaluates one layout.
struct SearchConstraints {
  // ep: a sparse model's expert-parallel size (searched over the divisors of dp and n_experts;
  // always 1 for a dense model).
  std::optional<int64_t> dp, tp, pp, virtual_stages, micro_batch, cp, ep;
  std::optional<bool> sequence_parallel;
  // A pipeline split (p·v layer counts, the runtime's layers_per_chunk) for the layouts whose
  // p·v matches it; empty: the even split where the layers divide, else the balanced partition.
  std::vector<int64_t> layers_per_chunk = {};
  int64_t max_pp = 0;  // 0: up to the layer count
  // Context parallelism is searched down to this many positions of a sequence per rank, so only
  // for sequences of twice that and more: below it the ring's block products are small tiles
  // whose per-block overheads (launches, the merge of partial results) the model does not price.
  // cp sizes must cut the sequence into 2·cp chunks.
  int64_t min_cp_positions = 4096;
  int64_t max_micro_batch = 16;    // largest b tried when b is not fixed
  int64_t max_virtual_stages = 8;  // largest v tried for the interleaved schedule
  // Megatron-LM before Megatron-Core's uneven splits (its arguments.py of 2021-22): the layers
  // split evenly over the p·v chunks (v = layers per stage ÷ --num-layers-per-virtual-pipeline-
  // stage) and the interleaved schedule only with pp > 2 ("pipeline-model-parallel size should
  // be greater than 2 with interleaved schedule").
  bool even_splits_only = false;
  std::vector<Recompute> recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  std::vector<int> zero_stages = {0, 1, 2, 3};
  std::vector<Schedule> schedules = {Schedule::kOneFOneB, Schedule::kInterleaved1F1B,
                                     Schedule::kGpipe, Schedule::kZeroBubbleH1};
  int top_k = 5;
  Objective objective = Objective::kTime;  // what the ranking minimises per token
};

struct SearchResult {
  std::vector<Evaluation> ranked;  // the top_k feasible layouts, the objective's best first
  int64_t evaluated = 0;           // layouts enumerated and judged
  int64_t feasible = 0;
  std::array<int64_t, 5> rejected{};  // by RejectReason
  // When nothing fits: the memory-rejected layout that came closest to fitting, and the first
  // layout rejected for any reason (so a fully fixed layout's rejection can be shown).
  std::optional<Evaluation> closest_to_fitting;
  std::optional<Evaluation> first_rejected;
};

// Throws ConfigError when the constraints contradict the setup (a fixed size that does not
// divide the device count, an empty list of allowed choices).
SearchResult search_layouts(const TrainingSetup& setup, const SearchConstraints& constraints);

}  // namespace lattice::plan
