// A parallel layout: how one training step is spread over dp × tp × pp devices, and the
// choices that trade memory for time (ZeRO stage, micro-batch, recompute, sequence
// parallelism, pipeline schedule).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "spec/model_kinds.h"
#include "spec/pipeline_schedule.h"

namespace lattice::plan {

// The runtime's own schedules and recompute modes (spec/pipeline_schedule.h,
// spec/model_kinds.h), with their names and parsers: the planner prices what the runtime runs.
using Schedule = ScheduleKind;
using lattice::parse_recompute;
using lattice::Recompute;
using lattice::recompute_name;

struct Layout {
  int64_t dp = 1;
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t virtual_stages = 1;  // v: model chunks per pipeline rank (interleaved only)
  int zero = 0;                // ZeRO stage 0..3 over the data-parallel group
  int64_t micro_batch = 1;     // b: sequences per micro-batch
  Recompute recompute = Recompute::kNone;
  bool sequence_parallel = false;
  Schedule schedule = Schedule::kOneFOneB;
  // Layers of each of the p·v pipeline chunks in model order (the runtime's layers_per_chunk);
  // empty: an even split when p·v divides the layers, else the runtime's balanced partition.
  std::vector<int64_t> layers_per_chunk = {};
  // Context parallelism: each sequence over cp ranks (ring attention, docs/context-parallel.md);
  // the gradients are reduced and ZeRO shards laid out over dp × cp.
  int64_t cp = 1;
  // Expert parallelism (sparse models): each layer's experts over ep consecutive ranks of the dp
  // group, tokens exchanged by all-to-all (docs/moe.md). Inside dp: it adds no devices.
  int64_t ep = 1;

  int64_t devices() const { return dp * tp * pp * cp; }
  int64_t replicas() const { return dp * cp; }  // the ranks holding the same dense parameters
  int64_t expert_replicas() const { return dp / ep; }  // ... the same experts
  bool operator==(const Layout&) const = default;
};

// m: micro-batches each pipeline runs per step (global batch ÷ (dp · b)).
inline int64_t micro_batches(const Layout& layout, int64_t global_batch) {
  return global_batch / (layout.dp * layout.micro_batch);
}

// "dp=8 tp=8 pp=4 v=2 zero=1 mb=1 recompute=selective sp schedule=interleaved-1f1b"
std::string describe(const Layout& layout);
// "7,8×14,7": layer counts with runs of equal ones folded.
std::string describe_layer_counts(const std::vector<int64_t>& counts);

// Whether `counts` (p·v chunk layer counts) can split `layers` over `pp` stages: they sum to
// the layers and every chunk holds one, except that with `empty_ends` the very first and very
// last chunk may hold none (Llama 3, Dubey et al. 2024 §3.3.2: "the first model chunk on the
// first stage has only the embedding, and the last model chunk on the last stage has only output
// projection and loss calculation"), as long as every stage still holds a layer.
bool valid_layer_split(const std::vector<int64_t>& counts, int64_t layers, int64_t pp,
                       bool empty_ends);

}  // namespace lattice::plan
