// Mixture of experts under every parallel layout the dense model runs: each equal to the
// single-rank run over 10 steps (losses 1e-5, gradient norms 1e-4), the same layout twice bitwise.
#include <gtest/gtest.h>

#include "../model/test_models.h"
#include "../train/equivalence_config.h"
#include "../train/test_corpus.h"
#include "train/layout_run.h"

namespace lattice {
namespace {

constexpr int kSteps = 10;

TrainConfig moe_config(float capacity_factor, const std::filesystem::path& data) {
  ModelConfig m = testing::test_model("mixtral-tiny");
  m.seq_len = 32;
  m.capacity_factor = capacity_factor;
  return testing::equivalence_config(
      m, data, {.seq_len = 32, .global_batch = 8, .micro_batches = 2, .steps = kSteps});
}

LayoutRunResult train(const TrainConfig& config, ParallelConfig layout) {
  layout.check_replicas = layout.dp > 1;
  layout.deterministic = true;
  return run_layout(config, {.layout = layout, .threads = 1, .warmup_steps = 0, .steps = kSteps});
}

struct MoeLayout {
  const char* name;
  ParallelConfig layout;
  float capacity_factor = 0.0f;
};

const std::vector<MoeLayout> kMoeLayouts = {
    {"tp2", {.tp = 2}},
    {"tp2_sp", {.tp = 2, .sequence_parallel = true}},
    {"dp2_zero0", {.dp = 2}},
    {"dp2_zero1", {.dp = 2, .zero = 1}},
    {"dp2_zero3", {.dp = 2, .zero = 3}},
    {"pp2", {.pp = 2}},
    {"tp2_pp2", {.tp = 2, .pp = 2}},
    {"dp2_tp2_zero1", {.dp = 2, .tp = 2, .zero = 1}},
    {"dp2_pp2_zero1", {.dp = 2, .zero = 1, .pp = 2}},
    {"recompute_full", {.recompute = Recompute::kFull}},
    {"recompute_selective_tp2", {.tp = 2, .recompute = Recompute::kSelective}},
    {"capacity_dp2", {.dp = 2}, 0.75f},
    {"capacity_tp2_pp2", {.tp = 2, .pp = 2}, 0.75f},
    // Expert parallelism: each layer's 4 experts over ep consecutive dp ranks.
    {"dp2_ep2", {.dp = 2, .ep = 2}},
    {"dp4_ep2", {.dp = 4, .ep = 2}},
    {"dp4_ep4", {.dp = 4, .ep = 4}},
    {"dp2_ep2_tp2", {.dp = 2, .tp = 2, .ep = 2}},
    {"dp2_ep2_pp2", {.dp = 2, .ep = 2, .pp = 2}},
    {"dp2_ep2_tp2_sp", {.dp = 2, .tp = 2, .ep = 2, .sequence_parallel = true}},
    {"capacity_dp2_ep2", {.dp = 2, .ep = 2}, 0.75f},
    {"dp2_ep2_tp2_pp2", {.dp = 2, .tp = 2, .ep = 2, .pp = 2}},
    {"dp4_ep4_tp2", {.dp = 4, .tp = 2, .ep = 4}},
    {"dp4_ep4_pp2", {.dp = 4, .ep = 4, .pp = 2}},
    {"dp4_ep4_tp2_pp2", {.dp = 4, .tp = 2, .ep = 4, .pp = 2}},
    // ZeRO-1 shards over the dp / ep ranks holding the same experts (none left at ep = dp).
    {"dp4_ep2_zero1", {.dp = 4, .ep = 2, .zero = 1}},
    {"dp4_ep4_zero1", {.dp = 4, .ep = 4, .zero = 1}},
    {"dp4_ep2_tp2_zero1", {.dp = 4, .tp = 2, .ep = 2, .zero = 1}},
    {"dp4_ep2_pp2_zero1", {.dp = 4, .ep = 2, .zero = 1, .pp = 2}},
    {"dp4_ep2_tp2_pp2_zero1", {.dp = 4, .tp = 2, .ep = 2, .zero = 1, .pp = 2}},
};

class MoeTraining : public ::testing::TestWithParam<MoeLayout> {};

TEST_P(MoeTraining, TenStepsMatchTheSingleRankRun) {
  const MoeLayout& l = GetParam();
  auto dir = testing::make_corpus_dir(std::string("moe_") + l.name);
  const TrainConfig config = moe_config(l.capacity_factor, dir);
  const LayoutRunResult single = train(config, {});
  const LayoutRunResult split = train(config, l.layout);
  testing::expect_equal_to_single_rank(split, single);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_LT(single.losses.back(), single.losses.front());
  if (l.layout.ep > 1) {  // the tokens crossed ranks: every rank all-to-all'ed over its ep group
    for (const RankRun& rank : split.ranks) {
      uint64_t exchanges = 0;
      for (const GroupTraffic& t : rank.traffic) {
        if (t.group.starts_with("ep[") && t.collective == Collective::kAllToAll) {
          exchanges += t.calls;
        }
      }
      EXPECT_GT(exchanges, 0u) << rank.at.to_string();
    }
  }
  if (l.layout.zero >= 1) {  // each rank kept the moments of its shard only, where one exists
    const bool sharded = l.layout.dp / std::max(1, l.layout.ep) > 1;
    for (const RankRun& rank : split.ranks) {
      if (sharded) {
        EXPECT_LT(rank.optimizer_elements, rank.store_elements) << rank.at.to_string();
      } else {
        EXPECT_EQ(rank.optimizer_elements, rank.store_elements) << rank.at.to_string();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeTraining, ::testing::ValuesIn(kMoeLayouts),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(MoeTrainingBitwise, SameLayoutTwiceIsBitwiseIdentical) {
  auto dir = testing::make_corpus_dir("moe_bitwise");
  const TrainConfig config = moe_config(0.0f, dir);
  const ParallelConfig layout{.dp = 2, .tp = 2, .zero = 1};
  const LayoutRunResult a = train(config, layout), b = train(config, layout);
  ASSERT_EQ(a.losses, b.losses);
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    EXPECT_EQ(a.ranks[r].parameter_hashes, b.ranks[r].parameter_hashes) << "rank " << r;
  }
}

}  // namespace
}  // namespace lattice
