// Asynchronous saves: the snapshot is taken when save() returns (later changes to the tensors
// are not in the checkpoint), one save at a time, and a failed write surfaces on the next
// call with nothing committed.
#include "ckpt/async_saver.h"

#include <gtest/gtest.h>

#include "ckpt/shard_reader.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

Manifest header(int64_t step) {
  Manifest m;
  m.step = step;
  return m;
}

TEST(AsyncCheckpointSaver, WritesTheSnapshotTakenAtSaveTime) {
  fs::path root = testing::scratch_dir("async_snapshot");
  Arena arena("test");
  Tensor t = Tensor::empty(arena, {64, 32}, DType::kF32);
  AsyncCheckpointSaver saver(root, {.keep_last = 2, .hook = {}});
  saver.reserve({OwnedShard::whole("t", t)});
  EXPECT_EQ(saver.snapshot_arena().stats().live_bytes, t.nbytes());
  for (int64_t step = 1; step <= 3; ++step) {
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(step * 10000 + i);
    saver.save(header(step), {OwnedShard::whole("t", t)});
    t.zero_();  // training goes on and changes the weights while the save is written
    // The snapshot buffers are allocated once and reused by every later save.
    EXPECT_EQ(saver.snapshot_arena().stats().live_bytes, t.nbytes()) << "step " << step;
  }
  saver.wait();
  EXPECT_FALSE(saver.in_flight());
  EXPECT_EQ(CheckpointRoot(root).committed_steps(), (std::vector<int64_t>{3, 2}));
  for (int64_t step : {2, 3}) {
    CheckpointReader reader(CheckpointRoot(root).step_dir(step));
    Tensor loaded = Tensor::empty(arena, {64, 32}, DType::kF32);
    reader.read_global("t", loaded);
    for (int64_t i = 0; i < loaded.numel(); ++i) {
      ASSERT_EQ(loaded.data<float>()[i], float(step * 10000 + i)) << "step " << step;
    }
  }
}

TEST(AsyncCheckpointSaver, AWriteErrorSurfacesOnTheNextCallAndNothingIsCommitted) {
  fs::path root = testing::scratch_dir("async_error");
  Arena arena("test");
  Tensor t = Tensor::zeros(arena, {4, 4}, DType::kF32);
  CommitOptions failing{.keep_last = 0, .hook = [](CommitStage stage) {
                          if (stage == CommitStage::kShardsWritten) {
                            throw IoError("disk full (injected)");
                          }
                        }};
  AsyncCheckpointSaver saver(root, failing);
  saver.save(header(5), {OwnedShard::whole("t", t)});  // returns before the failure
  try {
    saver.wait();
    FAIL() << "the write error was lost";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("disk full (injected)"), std::string::npos);
  }
  CheckpointRoot checkpoints(root);
  EXPECT_TRUE(checkpoints.committed_steps().empty());
  EXPECT_FALSE(fs::exists(checkpoints.staging_dir(5)));
  EXPECT_FALSE(checkpoints.latest_step().has_value());
  saver.wait();  // the error is reported once

  // Through save(): the previous failure is rethrown before a new save starts.
  saver.save(header(6), {OwnedShard::whole("t", t)});
  EXPECT_THROW(saver.save(header(7), {OwnedShard::whole("t", t)}), IoError);
  EXPECT_FALSE(saver.in_flight());
  EXPECT_TRUE(checkpoints.committed_steps().empty());
}

}  // namespace
}  // namespace lattice
