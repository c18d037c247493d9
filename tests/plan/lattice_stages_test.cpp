// The planner's copy of two pure functions of the Lattice runtime (plan/lattice_stages.h) against
// the runtime's own: the balanced stage partition (train/pipeline_stage.h partition_model) and
// the activation slots a stage's program needs (parallel/pipeline_runtime.h activation_slots).
#include "plan/lattice_stages.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/pipeline_runtime.h"
#include "plan/model_presets.h"
#include "spec/pipeline_schedule.h"
#include "train/pipeline_stage.h"

namespace lattice::plan {
namespace {

// The planner's and the trainer's description of one preset, with `layers` layers.
struct TwoSpecs {
  ModelSpec planner;
  ModelConfig trainer;
};

TwoSpecs specs(const std::string& preset, int64_t layers) {
  TwoSpecs s{model_preset(preset), lattice::model_preset(preset)};
  s.planner.n_layers = layers;
  s.trainer.n_layer = layers;
  return s;
}

TEST(LatticeStages, PartitionEqualsTheRuntimes) {
  int compared = 0, uneven = 0;
  for (const char* preset : {"gpt2-tiny", "llama-tiny", "shakespeare-char", "gpt2-124m"}) {
    for (int64_t layers : {2, 3, 4, 5, 7, 8, 12}) {
      const TwoSpecs s = specs(preset, layers);
      for (int p = 1; p <= 4; ++p) {
        for (int v = 1; v <= 3; ++v) {
          if (layers < int64_t(p * v)) {
            EXPECT_THROW(lattice_layers_per_chunk(s.planner, p, v), ConfigError);
            continue;
          }
          const StagePartition runtime = partition_model(s.trainer, p, v);
          const std::vector<int64_t> counts = lattice_layers_per_chunk(s.planner, p, v);
          ASSERT_EQ(counts.size(), runtime.chunks.size());
          for (size_t k = 0; k < counts.size(); ++k) {
            EXPECT_EQ(counts[k], runtime.chunks[k].layer_count())
                << preset << " l=" << layers << " p=" << p << " v=" << v << " chunk " << k;
            uneven += counts[k] != counts[0];
          }
          for (int stage = 0; stage < p; ++stage) {
            const LatticeStagePart planned = lattice_stage_part(s.planner, p, v, stage);
            const ModelPart part = stage_part(runtime, p, stage);
            ASSERT_EQ(planned.chunks.size(), part.chunks.size());
            for (size_t c = 0; c < part.chunks.size(); ++c) {
              EXPECT_EQ(planned.chunks[c].first_layer, part.chunks[c].first_layer);
              EXPECT_EQ(planned.chunks[c].last_layer, part.chunks[c].last_layer);
              EXPECT_EQ(planned.chunks[c].embedding, part.chunks[c].embedding);
              EXPECT_EQ(planned.chunks[c].head, part.chunks[c].head);
            }
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 150);
  EXPECT_GT(uneven, 0) << "the sweep must include partitions that are not l / (p·v) each";
}

TEST(LatticeStages, SlotsEqualTheRuntimesPeakInFlight) {
  const std::pair<ScheduleKind, Schedule> kinds[] = {
      {ScheduleKind::kGpipe, Schedule::kGpipe},
      {ScheduleKind::kOneFOneB, Schedule::kOneFOneB},
      {ScheduleKind::kZeroBubbleH1, Schedule::kZeroBubbleH1},
      {ScheduleKind::kInterleaved1F1B, Schedule::kInterleaved1F1B}};
  int compared = 0;
  for (const auto& [runtime_kind, kind] : kinds) {
    const bool interleaved = kind == Schedule::kInterleaved1F1B;
    for (int p : {2, 3, 4, 8}) {
      for (int m : {1, 2, 3, 4, 6, 8, 16}) {
        for (int v : {1, 2, 3}) {
          if (interleaved != (v > 1) || (interleaved && m % p != 0)) continue;
          const lattice::Schedule schedule = make_schedule(runtime_kind, p, m, v);
          for (int stage = 0; stage < p; ++stage) {
            // The runtime uses slot mb % slots, so only min(slots, m) are ever allocated.
            const int64_t runtime_slots =
                std::min<int64_t>(activation_slots(schedule.per_rank[size_t(stage)]), m);
            EXPECT_EQ(lattice_activation_slots(kind, p, m, v, stage), runtime_slots)
                << schedule_kind_name(kind) << " p=" << p << " m=" << m << " v=" << v << " stage "
                << stage;
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 300);
  EXPECT_EQ(lattice_activation_slots(Schedule::kOneFOneB, 1, 8, 1, 0), 1);  // no pipeline
}

}  // namespace
}  // namespace lattice::plan
