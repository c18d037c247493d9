// Elastic snapshots in shared-memory slots (ckpt/snapshot_slots.h): each rank writes its shard
// of every step into the older of its two slots, no file, manifest or commit per step; after a
// failure the newest step every rank of the world completed is committed as a checkpoint that
// reads back exactly, and a slot never published (a writer killed or fenced mid-write) or
// corrupted is never restored: the step before it is.
#include "ckpt/snapshot_slots.h"

#include <gtest/gtest.h>

#include <fstream>

#include "ckpt/collective_async_saver.h"
#include "ckpt/shard_reader.h"
#include "core/error.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

constexpr int kRanks = 2;

Manifest header_of(int64_t step, int world) {
  Manifest manifest;
  manifest.step = step;
  manifest.layout.dp = world;
  manifest.state["note"] = "slot test";
  return manifest;
}

// Rank `rank`'s half of a 64 x 32 tensor "t" at `step`: element i of the whole holds
// step * 10000 + i.
void write_half(SnapshotSlotWriter& writer, Tensor& t, int rank, int64_t step, int world = 2) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(step * 10000 + i);
  const int64_t rows = 64 / world;
  const int64_t begin = rows * rank;
  writer.write(header_of(step, world), {OwnedShard::rows("t", Shape({64, 32}), begin, begin + rows,
                                                         t.slice_rows(begin, begin + rows))});
}

void expect_step_reads_back(const fs::path& dir, int64_t step) {
  Arena arena("read");
  Tensor back = Tensor::empty(arena, {64, 32}, DType::kF32);
  CheckpointReader(dir).read_global("t", back);
  for (int64_t i = 0; i < back.numel(); ++i) {
    ASSERT_EQ(back.data<float>()[i], float(step * 10000 + i)) << "element " << i;
  }
}

class SnapshotSlotsTest : public testing::ScratchDirTest {
 protected:
  Arena arena_{"slots_test", size_t(1) << 20};
  Tensor t_ = Tensor::empty(arena_, {64, 32}, DType::kF32);
};

TEST_F(SnapshotSlotsTest, TheNewestStepEveryRankCompletedIsCommittedAndReadsBack) {
  {
    std::vector<std::unique_ptr<SnapshotSlotWriter>> writers;
    for (int r = 0; r < kRanks; ++r) {
      writers.push_back(std::make_unique<SnapshotSlotWriter>(dir_, r, /*generation=*/0));
    }
    for (int64_t step = 1; step <= 5; ++step) {
      for (int r = 0; r < kRanks; ++r) write_half(*writers[size_t(r)], t_, r, step);
    }
    // Two slots a rank, written in turn; nothing else: no step directory, no manifest.
    int slots = 0;
    for (const auto& entry : fs::directory_iterator(dir_ / "slots")) {
      EXPECT_TRUE(entry.path().filename().string().starts_with("rank_0000")) << entry.path();
      ++slots;
    }
    EXPECT_EQ(slots, 2 * kRanks);
    EXPECT_TRUE(CheckpointRoot(dir_).committed_steps().empty());
  }  // the ranks are gone; their slots stay
  const std::optional<SlotSnapshot> newest = newest_slot_snapshot(dir_);
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->step, 5);
  EXPECT_EQ(newest->world, kRanks);
  EXPECT_EQ(newest_restorable_step(dir_), 5);  // what the agent reports restoring

  const std::optional<fs::path> committed = commit_slot_snapshot(dir_, {.keep_last = 2});
  ASSERT_EQ(committed, dir_ / "step_5");
  EXPECT_EQ(CheckpointRoot(dir_).latest_step(), 5);
  expect_step_reads_back(dir_ / "step_5", 5);
  EXPECT_FALSE(commit_slot_snapshot(dir_).has_value());  // nothing newer than step 5
  remove_slots(dir_);
  EXPECT_FALSE(newest_slot_snapshot(dir_).has_value());
  EXPECT_EQ(newest_restorable_step(dir_), 5);
}

// Rank 1 is superseded (its fence throws) while writing step 4: its slot holds every byte but
// was never published. Step 3 is restored, from the slot the double buffer kept.
TEST_F(SnapshotSlotsTest, ASlotNeverPublishedIsNotRestoredButTheStepBeforeIs) {
  bool superseded = false;
  SnapshotSlotWriter rank0(dir_, 0, 0);
  SnapshotSlotWriter rank1(dir_, 1, 0, [&] {
    if (superseded) LATTICE_THROW(CommError, "fenced: a newer generation started");
  });
  for (int64_t step = 1; step <= 3; ++step) {
    write_half(rank0, t_, 0, step);
    write_half(rank1, t_, 1, step);
  }
  write_half(rank0, t_, 0, 4);
  // While a slot holds its bytes but is not yet published, it does not count.
  std::optional<int64_t> seen_while_torn;
  SnapshotSlotWriter watched(dir_ / "watched", 0, 0, {}, [&] {
    seen_while_torn =
        newest_slot_snapshot(dir_ / "watched").value_or(SlotSnapshot{.step = -1}).step;
  });
  write_half(watched, t_, 0, 1, 1);
  write_half(watched, t_, 0, 2, 1);
  EXPECT_EQ(seen_while_torn, 1);
  superseded = true;
  EXPECT_THROW(write_half(rank1, t_, 1, 4), CommError);
  EXPECT_EQ(newest_slot_snapshot(dir_)->step, 3);
  EXPECT_EQ(newest_restorable_step(dir_), 3);
  ASSERT_EQ(commit_slot_snapshot(dir_), dir_ / "step_3");
  expect_step_reads_back(dir_ / "step_3", 3);
}

// A byte of rank 0's newest slot flipped in memory: its checksum fails, the warning names it,
// and the step before (whole on both ranks) is committed instead.
TEST_F(SnapshotSlotsTest, ACorruptSlotIsPassedOverForTheStepBefore) {
  fs::path newest_slot;
  {
    SnapshotSlotWriter rank0(dir_, 0, 0), rank1(dir_, 1, 0);
    for (int64_t step = 1; step <= 2; ++step) {
      write_half(rank0, t_, 0, step);
      write_half(rank1, t_, 1, step);
    }
    newest_slot = rank0.slot_path(1);  // step 1 went to slot 0, step 2 to slot 1
  }
  {
    std::fstream f(newest_slot, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 2000);
    f.put('\x7f');
  }
  ASSERT_EQ(commit_slot_snapshot(dir_), dir_ / "step_1");
  expect_step_reads_back(dir_ / "step_1", 1);
  EXPECT_FALSE(fs::exists(dir_ / "step_2.tmp"));
}

// A world that shrank: generation 1 of one rank wrote steps 6 and 7 while generation 0's two
// ranks left slots up to step 8 behind. The newest generation wins, whole on its one rank.
TEST_F(SnapshotSlotsTest, TheNewestGenerationWinsOverAnOlderWorldsLaterSteps) {
  {
    SnapshotSlotWriter rank0(dir_, 0, 0), rank1(dir_, 1, 0);
    for (int64_t step = 7; step <= 8; ++step) {
      write_half(rank0, t_, 0, step);
      write_half(rank1, t_, 1, step);
    }
  }
  // Generation 1's rank 0 takes over rank 0's files (the older world's rank 1 stays behind).
  SnapshotSlotWriter alone(dir_, 0, 1);
  alone.reserve(header_of(5, 1), {OwnedShard::whole("t", t_)});
  for (int64_t step = 6; step <= 7; ++step) write_half(alone, t_, 0, step, 1);
  const std::optional<SlotSnapshot> newest = newest_slot_snapshot(dir_);
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->generation, 1);
  EXPECT_EQ(newest->step, 7);
  EXPECT_EQ(newest->world, 1);
  ASSERT_EQ(commit_slot_snapshot(dir_), dir_ / "step_7");
  expect_step_reads_back(dir_ / "step_7", 7);
  EXPECT_EQ(CheckpointReader(dir_ / "step_7").manifest().layout.dp, 1);
}

// Slots that cannot be made (here a directory that cannot exist) are an IoError naming where.
TEST_F(SnapshotSlotsTest, SlotsThatCannotBeMadeAreANamedError) {
  try {
    SnapshotSlotWriter writer("/proc/self/no_such_dir", 0, 0);
    FAIL() << "expected an IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/self/no_such_dir/slots"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lattice
