// Resharding over dp and ZeRO stages in one process: a checkpoint written by simulated ZeRO
// ranks (uneven flat ranges of the parameter store that cut tensors mid-row) loads on one rank,
// and one written on one rank loads into any other split, master weights and both moments
// bitwise equal.
#include "ckpt/flat_range.h"

#include <gtest/gtest.h>

#include <cstring>

#include "ckpt/checkpoint.h"
#include "core/philox.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

struct Trained {
  Arena arena{"trained"};
  TrainConfig config;
  Transformer model;
  AdamW optimizer;
  TrainingState state{.step = 2, .lr_step = 2, .data = {.index = 16}, .seed = 5};

  Trained()
      : model(model_preset("gpt2-tiny"), arena, DType::kF32),
        optimizer(model.parameters(), arena, config.adam) {
    config.model = model.config();
    model.initialize(5);
    Tensor& g = model.parameters().grads();
    for (uint64_t step = 0; step < 2; ++step) {
      fill_normal(g.data<float>(), g.numel(), 5, step, 0, 0.0f, 0.1f);
      optimizer.step(1e-3f);
    }
  }
  int64_t total() const { return model.registry().total_elements(); }
};

Tensor flat(const Tensor& t, int64_t begin, int64_t end) {
  return t.view(Shape{t.numel()}).slice_rows(begin, end);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Uneven cuts of [0, total) into n ranges, none on a tensor boundary by design.
std::vector<int64_t> cuts(int64_t total, int n) {
  std::vector<int64_t> c{0};
  for (int r = 1; r < n; ++r) c.push_back(total * r / n + 7 * r);
  c.push_back(total);
  return c;
}

fs::path save_as_zero_ranks(Trained& t, const fs::path& root_dir, int n) {
  CheckpointRoot root(root_dir);
  fs::path staging = root.prepare_staging(t.state.step);
  std::vector<int64_t> c = cuts(t.total(), n);
  std::vector<RankWriteResult> results;
  for (int r = 0; r < n; ++r) {
    const int64_t b = c[size_t(r)], e = c[size_t(r) + 1];
    results.push_back(write_rank_shards(
        staging, r,
        flat_range_shards(t.model.registry(), t.model.parameters().master(),
                          flat(t.optimizer.m(), b, e), flat(t.optimizer.v(), b, e), b, e)));
  }
  Manifest manifest = training_manifest(t.config, t.model, t.state);
  manifest.layout = {n, 1, 1, 1, 1};
  return root.commit(manifest, results);
}

void expect_ranges_load_bitwise(Trained& t, const fs::path& dir, int n) {
  CheckpointReader reader(dir);
  Arena arena("ranks");
  std::vector<int64_t> c = cuts(t.total(), n);
  for (int r = 0; r < n; ++r) {
    const int64_t b = c[size_t(r)], e = c[size_t(r) + 1];
    Tensor master = Tensor::zeros(arena, {e - b}, DType::kF32);
    Tensor m = Tensor::zeros(arena, {e - b}, DType::kF32);
    Tensor v = Tensor::zeros(arena, {e - b}, DType::kF32);
    read_flat_range(reader, t.model.registry(), b, e, master, m, v);
    EXPECT_TRUE(same_bytes(master, flat(t.model.parameters().master(), b, e))) << "rank " << r;
    EXPECT_TRUE(same_bytes(m, flat(t.optimizer.m(), b, e))) << "rank " << r;
    EXPECT_TRUE(same_bytes(v, flat(t.optimizer.v(), b, e))) << "rank " << r;
  }
}

TEST(Reshard, ZeroRanksCheckpointLoadsOnOneRankAndOnAnyOtherSplit) {
  Trained t;
  fs::path dir = save_as_zero_ranks(t, testing::scratch_dir("reshard_dp3"), 3);
  EXPECT_EQ(CheckpointReader(dir).manifest().layout, (CheckpointLayout{3, 1, 1, 1, 1}));

  Arena arena("fresh");
  Transformer model(t.config.model, arena, DType::kF32);
  AdamW optimizer(model.parameters(), arena, t.config.adam);
  EXPECT_EQ(load_training_checkpoint(dir, model, optimizer), t.state);
  EXPECT_TRUE(same_bytes(model.parameters().master(), t.model.parameters().master()));
  EXPECT_TRUE(same_bytes(optimizer.m(), t.optimizer.m()));
  EXPECT_TRUE(same_bytes(optimizer.v(), t.optimizer.v()));

  for (int n : {2, 4}) expect_ranges_load_bitwise(t, dir, n);
}

TEST(Reshard, OneRankCheckpointLoadsIntoZeroRanges) {
  Trained t;
  fs::path dir = save_training_checkpoint(testing::scratch_dir("reshard_dp1"), t.config, t.model,
                                          t.optimizer, t.state);
  for (int n : {2, 5}) expect_ranges_load_bitwise(t, dir, n);
}

}  // namespace
}  // namespace lattice
