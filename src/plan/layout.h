// A parallel layout: how one training step is spread over dp × tp × pp devices, and the
// choices that trade memory for time (ZeRO stage, micro-batch, recompute, sequence
// parallelism, pipeline schedule).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lattice::plan {

// The pipeline issue's schedules: 1F1B (PipeDream-Flush), interleaved 1F1B with v model
// chunks per rank (Narayanan et al. 2021), GPipe (all forwards, then all backwards), ZB-H1
// (backward split into input- and weight-gradient halves, Qi et al. 2023).
enum class Schedule { kOneFOneB, kInterleaved, kGpipe, kZbH1 };
// What the backward recomputes: nothing, the attention core (Korthikanti et al.'s selective
// recompute), or each whole layer from its stored input.
enum class Recompute { kNone, kSelective, kFull };

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

  int64_t devices() const { return dp * tp * pp; }
  bool operator==(const Layout&) const = default;
};

// m: micro-batches each pipeline runs per step (global batch ÷ (dp · b)).
inline int64_t micro_batches(const Layout& layout, int64_t global_batch) {
  return global_batch / (layout.dp * layout.micro_batch);
}

// "dp=8 tp=8 pp=4 v=2 zero=1 mb=1 recompute=selective sp schedule=interleaved"
std::string describe(const Layout& layout);

std::string_view schedule_name(Schedule s);
std::string_view recompute_name(Recompute r);
// Throw ConfigError listing the valid names.
Schedule parse_schedule(std::string_view name);
Recompute parse_recompute(std::string_view name);

}  // namespace lattice::plan
