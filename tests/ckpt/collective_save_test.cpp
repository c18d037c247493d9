// The multi-rank save (collective_save.h): every rank writes its own file, world rank 0
// commits, and a failure on any rank (a bad shard, a commit that fails) reaches every rank as
// one IoError naming the rank, with nothing committed and the previous checkpoint intact.
#include "ckpt/collective_save.h"

#include <gtest/gtest.h>

#include <mutex>

#include "ckpt/shard_reader.h"
#include "comm/thread_world.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

Manifest header(int64_t step) {
  Manifest m;
  m.step = step;
  m.layout = {1, 3, 1, 1, 0};
  return m;
}

// Rank r of 3 owns columns [2r, 2r + 2) of a (4, 6) tensor whose value is 10·row + col + step
// (a column split: a box, not a flat range); rank 0 also owns the replicated "b".
std::vector<OwnedShard> owned(Arena& arena, int rank, int64_t step, bool broken = false) {
  Tensor w = Tensor::empty(arena, {4, 2}, DType::kF32);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 2; ++c)
      w.data<float>()[r * 2 + c] = float(10 * r + 2 * rank + c + step);
  }
  ShardBox box{{0, 2 * rank}, {4, broken ? 3 : 2}};  // broken: 12 elements declared, 8 given
  std::vector<OwnedShard> shards{{"w", Shape{4, 6}, box, w}};
  if (rank == 0) {
    Tensor b = Tensor::empty(arena, {3}, DType::kF32);
    for (int k = 0; k < 3; ++k) b.data<float>()[k] = float(k + step);
    shards.push_back(OwnedShard::whole("b", b));
  }
  return shards;
}

TEST(CollectiveSave, EveryRankWritesItsBoxesAndRankZeroCommits) {
  const fs::path root_dir = testing::scratch_dir("collective");
  std::mutex mutex;
  std::vector<fs::path> dirs;
  run_ranks(3, [&](Communicator& world) {
    Arena arena("rank");
    fs::path dir = save_sharded_checkpoint(CheckpointRoot(root_dir), header(4),
                                           owned(arena, world.rank(), 4), world);
    std::lock_guard lock(mutex);
    dirs.push_back(dir);
  });
  ASSERT_EQ(dirs.size(), 3u);
  for (const fs::path& d : dirs) EXPECT_EQ(d, root_dir / "step_4");
  CheckpointReader reader(root_dir / "step_4");
  EXPECT_EQ(reader.tensor("w").shards.size(), 3u);
  EXPECT_EQ(reader.manifest().files.size(), 3u);
  Arena arena("read");
  Tensor w = Tensor::empty(arena, {4, 6}, DType::kF32);
  reader.read_global("w", w);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 6; ++c) EXPECT_EQ(w.data<float>()[r * 6 + c], float(10 * r + c + 4));
  }
  EXPECT_EQ(CheckpointRoot(root_dir).latest_step(), 4);
}

TEST(CollectiveSave, AFailureOnOneRankReachesEveryRankAndCommitsNothing) {
  const fs::path root_dir = testing::scratch_dir("collective_fail");
  run_ranks(3, [&](Communicator& world) {
    Arena arena("rank");
    save_sharded_checkpoint(CheckpointRoot(root_dir), header(1), owned(arena, world.rank(), 1),
                            world);
  });
  std::mutex mutex;
  std::vector<std::string> errors;
  run_ranks(3, [&](Communicator& world) {
    Arena arena("rank");
    try {
      save_sharded_checkpoint(CheckpointRoot(root_dir), header(2),
                              owned(arena, world.rank(), 2, /*broken=*/world.rank() == 1), world);
    } catch (const IoError& e) {
      std::lock_guard lock(mutex);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 3u) << "every rank must learn of the failure";
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("writing shards failed on\n  rank 1: shard of 'w' [4, 6]"), std::string::npos)
        << e;
  }
  EXPECT_FALSE(fs::exists(root_dir / "step_2"));
  EXPECT_FALSE(fs::exists(root_dir / "step_2.tmp"));
  EXPECT_EQ(CheckpointRoot(root_dir).latest_step(), 1);
  EXPECT_NO_THROW(CheckpointReader(root_dir / "step_1"));

  // The commit itself failing on rank 0 (a hook standing in for a full disk).
  errors.clear();
  CommitOptions options;
  options.hook = [](CommitStage stage) {
    if (stage == CommitStage::kManifestWritten) throw IoError("disk full (injected)");
  };
  run_ranks(3, [&](Communicator& world) {
    Arena arena("rank");
    try {
      save_sharded_checkpoint(CheckpointRoot(root_dir), header(3), owned(arena, world.rank(), 3),
                              world, options);
    } catch (const IoError& e) {
      std::lock_guard lock(mutex);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 3u);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("the commit failed on\n  rank 0: disk full (injected)"), std::string::npos)
        << e;
  }
  EXPECT_FALSE(fs::exists(root_dir / "step_3"));
  EXPECT_EQ(CheckpointRoot(root_dir).latest_step(), 1);
}

TEST(CollectiveSave, StringsOfEveryLengthGatherInRankOrder) {
  std::mutex mutex;
  run_ranks(4, [&](Communicator& world) {
    const std::string mine(size_t(world.rank() * 3), char('a' + world.rank()));  // rank 0: ""
    std::vector<std::string> all =
        all_gather_strings(world, mine, std::chrono::milliseconds(10000));
    std::lock_guard lock(mutex);
    ASSERT_EQ(all.size(), 4u);
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(all[size_t(r)], std::string(size_t(r * 3), char('a' + r)));
  });
}

}  // namespace
}  // namespace lattice
