// Asynchronous checkpoints of multi-rank trainers (TrainerCheckpointer with async, over
// CollectiveAsyncSaver): every rank snapshots what it owns and writes it on a background
// thread; world rank 0 commits once every rank's write succeeded.
//
// (1) A run that saves asynchronously at step 3 and trains on (changing the tensors the
// snapshot came from while they are written) resumes from that checkpoint, under the same
// layout, with bitwise the per-step losses and final parameters and moments of the run that
// never stopped. (2) A write failure injected on one rank of 2 (and of 4) reaches every rank as
// the same IoError, at the next save and at the end of training; no step_N of that save exists
// (nor its staging directory), `latest` still names the previous checkpoint, which loads; the
// saver works again afterwards.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <atomic>

#include "../train/equivalence_config.h"
#include "../train/test_corpus.h"
#include "ckpt/checkpoint.h"
#include "ckpt/trainer_checkpoint.h"
#include "ckpt/trainer_checkpointer.h"
#include "support/scratch_dir.h"
#include "trainer_layouts.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;
using testing::GlobalState;
using testing::TrainerLayout;

constexpr int kSteps = 6;

TrainConfig train_config(const fs::path& data) {
  ModelConfig model = model_preset("gpt2-tiny");
  model.n_layer = 4;
  model.seq_len = 12;
  return testing::equivalence_config(model, data, {.steps = kSteps});
}

fs::path corpus_dir() {
  static const fs::path dir = testing::make_corpus_dir(fmt::format("ckpt_async_{}", ::getpid()));
  return dir;
}

struct AsyncRun {
  std::vector<double> losses;  // per step trained
  GlobalState final_state;
};

// Trains `layout` to kSteps, from `resume` when given; saves asynchronously after the steps in
// `save_at` (into `root`), polling after every step, and finishes at the end.
AsyncRun train(const TrainerLayout& layout, const fs::path& root, const std::vector<int>& save_at,
               const fs::path& resume = {}) {
  AsyncRun run;
  std::mutex mutex;
  const TrainConfig config = train_config(corpus_dir());
  run_ranks(layout.world_size(), [&](Communicator& world) {
    DeviceMesh mesh(world, layout.shape());
    Arena arena(fmt::format("rank{}", world.rank()));
    Trainer trainer(config, arena, layout.setup(mesh));
    if (!resume.empty()) load_trainer_checkpoint(resume, trainer);
    TrainerCheckpointer checkpoints(root, trainer, world, {.async = true});
    std::vector<double> losses;
    while (trainer.step() < kSteps) {
      losses.push_back(trainer.train_step().loss);
      checkpoints.after_step();
      if (std::find(save_at.begin(), save_at.end(), trainer.step()) != save_at.end()) {
        checkpoints.save();
      }
    }
    checkpoints.finish();
    EXPECT_EQ(checkpoints.last_committed(),
              save_at.empty()
                  ? std::nullopt
                  : std::optional<fs::path>(root / fmt::format("step_{}", save_at.back())));
    std::lock_guard lock(mutex);
    testing::contribute(trainer, run.final_state);
    if (world.rank() == 0) run.losses = losses;
  });
  return run;
}

class AsyncResume : public ::testing::TestWithParam<TrainerLayout> {};

TEST_P(AsyncResume, ResumesBitwiseFromAnAsynchronousSave) {
  const TrainerLayout layout = GetParam();
  const fs::path root = testing::scratch_dir("async_resume_" + layout.name());
  const AsyncRun whole = train(layout, root, {3});
  ASSERT_EQ(whole.losses.size(), size_t(kSteps));
  EXPECT_EQ(CheckpointRoot(root).latest_step(), 3);

  const AsyncRun resumed =
      train(layout, testing::scratch_dir("async_resumed_" + layout.name()), {}, root / "step_3");
  ASSERT_EQ(resumed.losses.size(), size_t(kSteps - 3));
  for (size_t s = 0; s < resumed.losses.size(); ++s) {
    EXPECT_EQ(resumed.losses[s], whole.losses[3 + s]) << "step " << 4 + s;
  }
  testing::expect_same_state(resumed.final_state, whole.final_state, "final state");
}

INSTANTIATE_TEST_SUITE_P(Layouts, AsyncResume,
                         ::testing::Values(TrainerLayout{.dp = 2, .zero = 1},
                                           TrainerLayout{.dp = 2, .pp = 2, .zero = 1},
                                           TrainerLayout{.tp = 2, .pp = 2, .v = 2}),
                         [](const ::testing::TestParamInfo<TrainerLayout>& info) {
                           return info.param.name();
                         });

struct FailureCase {
  TrainerLayout layout;
  int failing_rank;
};

void PrintTo(const FailureCase& c, std::ostream* os) {
  *os << c.layout.name() << ", rank " << c.failing_rank << " fails";
}

class AsyncWriteFailure : public ::testing::TestWithParam<FailureCase> {};

// Saves at steps 2 (succeeds) and 4 (rank `failing_rank`'s write fails), then tries to save at
// step 5 (the error surfaces there, on every rank, and nothing starts), saves again (it works)
// and fails at step 6 once more, which surfaces at finish().
TEST_P(AsyncWriteFailure, EveryRankSeesTheSameErrorAndNothingIsCommitted) {
  const FailureCase c = GetParam();
  const fs::path root = testing::scratch_dir("async_failure_" + c.layout.name());
  const TrainConfig config = train_config(corpus_dir());
  std::array<std::atomic<int>, 8> writes{};
  std::mutex mutex;
  std::vector<std::string> at_save, at_finish;
  std::vector<bool> step4_visible;
  run_ranks(c.layout.world_size(), [&](Communicator& world) {
    DeviceMesh mesh(world, c.layout.shape());
    Arena arena(fmt::format("rank{}", world.rank()));
    Trainer trainer(config, arena, c.layout.setup(mesh));
    TrainerCheckpointOptions options{.async = true};
    options.commit.before_write = [&](int rank) {
      const int write = writes[size_t(rank)]++;  // 0: step 2, 1: step 4, 2: step 5, 3: step 6
      if (rank == c.failing_rank && (write == 1 || write == 3)) {
        throw IoError(fmt::format("no space left on device (injected, write {})", write));
      }
    };
    TrainerCheckpointer checkpoints(root, trainer, world, options);
    for (int s = 1; s <= 4; ++s) {
      trainer.train_step();
      checkpoints.after_step();
      if (s == 2 || s == 4) checkpoints.save();
    }
    trainer.train_step();
    checkpoints.after_step();
    std::string save_error;
    try {
      checkpoints.save();  // step 5: the failed step-4 save is reported here
    } catch (const IoError& e) {
      save_error = e.what();
    }
    // Between the failure and the next save nothing was committed.
    const bool visible = fs::exists(root / "step_4") || fs::exists(root / "step_4.tmp");
    checkpoints.save();  // step 5 again: works
    trainer.train_step();
    checkpoints.save();  // step 6: fails on the failing rank
    std::string finish_error;
    try {
      checkpoints.finish();
    } catch (const IoError& e) {
      finish_error = e.what();
    }
    std::lock_guard lock(mutex);
    at_save.push_back(save_error);
    at_finish.push_back(finish_error);
    step4_visible.push_back(visible);
  });
  ASSERT_EQ(at_save.size(), size_t(c.layout.world_size()));
  for (size_t r = 0; r < at_save.size(); ++r) {
    EXPECT_EQ(at_save[r], at_save[0]) << "rank order " << r;
    EXPECT_EQ(at_finish[r], at_finish[0]) << "rank order " << r;
    EXPECT_FALSE(step4_visible[r]);
  }
  for (const std::string& error : {at_save[0], at_finish[0]}) {
    EXPECT_NE(error.find(fmt::format("rank {}: no space left on device", c.failing_rank)),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("was not committed"), std::string::npos) << error;
  }
  EXPECT_NE(at_save[0].find("step_4"), std::string::npos) << at_save[0];
  EXPECT_NE(at_finish[0].find("step_6"), std::string::npos) << at_finish[0];

  const CheckpointRoot saved(root);
  EXPECT_EQ(saved.committed_steps(), (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(saved.latest_step(), 5);
  EXPECT_FALSE(fs::exists(root / "step_6.tmp"));
  const std::optional<ResumeChoice> choice = resume_auto(root);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->step, 5);
  EXPECT_TRUE(choice->skipped.empty());
  CheckpointReader previous(root / "step_2");  // the checkpoint before the failure verifies
  EXPECT_EQ(previous.manifest().step, 2);
}

INSTANTIATE_TEST_SUITE_P(Layouts, AsyncWriteFailure,
                         ::testing::Values(FailureCase{{.dp = 2, .zero = 1}, 1},
                                           FailureCase{{.dp = 2, .pp = 2, .zero = 1}, 3},
                                           FailureCase{{.dp = 2, .tp = 2}, 0}),
                         [](const ::testing::TestParamInfo<FailureCase>& info) {
                           return fmt::format("{}_rank{}_fails", info.param.layout.name(),
                                              info.param.failing_rank);
                         });

// The saver of one rank: its own collectives are trivial, the protocol the same.
TEST(CollectiveAsyncSaver, AWorldOfOneCommitsAtPollOrWait) {
  const fs::path root = testing::scratch_dir("async_one_rank");
  run_ranks(1, [&](Communicator& world) {
    Arena arena("test");
    Tensor t = Tensor::empty(arena, {16, 8}, DType::kF32);
    CollectiveAsyncSaver saver(root, world, {.keep_last = 2});
    for (int64_t step = 1; step <= 3; ++step) {
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(step * 1000 + i);
      Manifest manifest;
      manifest.step = step;
      saver.save(manifest, {OwnedShard::whole("t", t)});
      t.zero_();  // the snapshot, not the tensor, is written
      while (!saver.poll()) {
      }
      EXPECT_FALSE(saver.in_flight());
      ASSERT_EQ(saver.last_committed(), root / fmt::format("step_{}", step));
      Tensor back = Tensor::empty(arena, {16, 8}, DType::kF32);
      CheckpointReader(root / fmt::format("step_{}", step)).read_global("t", back);
      EXPECT_EQ(back.data<float>()[5], float(step * 1000 + 5));
    }
    saver.wait();
  });
  EXPECT_EQ(CheckpointRoot(root).committed_steps(), (std::vector<int64_t>{3, 2}));
}

// One save of a 2-rank world's tensor `t` (16 × 8, filled with step·1000 + i): each rank its
// half of the rows.
void save_half(CollectiveAsyncSaver& saver, Tensor& t, int rank, int64_t step) {
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(step * 1000 + i);
  Manifest manifest;
  manifest.step = step;
  manifest.layout.dp = 2;
  const int64_t half = 8 * rank;
  saver.save(manifest,
             {OwnedShard::rows("t", Shape({16, 8}), half, half + 8, t.slice_rows(half, half + 8))});
}

// Elastic snapshots (CommitOptions::record_writes): a save both ranks finished writing but whose
// world ended before the collective commit counts as restorable, is committed by the next
// world's lead rank and reads back; without one rank's record (it died mid-write) it is not, and
// the newest committed step stays the one to restore.
TEST(CollectiveAsyncSaver, ASaveEveryRankWroteIsCommittedAfterItsWorldEnded) {
  for (bool torn : {false, true}) {
    const fs::path root = testing::scratch_dir(torn ? "async_written_torn" : "async_written");
    const CommitOptions options{.keep_last = 2, .record_writes = true};
    run_ranks(2, [&](Communicator& world) {
      Arena arena("test");
      Tensor t = Tensor::empty(arena, {16, 8}, DType::kF32);
      CollectiveAsyncSaver saver(root, world, options);
      for (int64_t step = 1; step <= 2; ++step) save_half(saver, t, world.rank(), step);
      // Step 1 committed by the second save; step 2 written, then the world ends uncommitted.
      saver.wait_written();
    });
    ASSERT_EQ(CheckpointRoot(root).committed_steps(), (std::vector<int64_t>{1}));
    ASSERT_TRUE(fs::exists(root / "step_2.tmp" / "written_rank_00001.json"));
    // What the agent reports restoring: the written step, not a torn one.
    EXPECT_EQ(newest_restorable_step(root), 2);
    if (torn) {
      fs::remove(root / "step_2.tmp" / "written_rank_00001.json");
      EXPECT_EQ(newest_restorable_step(root), 1);
    }
    const std::optional<fs::path> committed = commit_written_staging(root, options);
    if (torn) {
      EXPECT_FALSE(committed.has_value());
      EXPECT_EQ(CheckpointRoot(root).committed_steps(), (std::vector<int64_t>{1}));
      continue;
    }
    ASSERT_EQ(committed, root / "step_2");
    EXPECT_EQ(CheckpointRoot(root).latest_step(), 2);
    EXPECT_FALSE(fs::exists(root / "step_2" / "written_rank_00000.json"));  // not the checkpoint's
    Arena arena("read");
    Tensor back = Tensor::empty(arena, {16, 8}, DType::kF32);
    CheckpointReader(root / "step_2").read_global("t", back);
    for (int64_t i = 0; i < back.numel(); ++i) ASSERT_EQ(back.data<float>()[i], float(2000 + i));
    EXPECT_FALSE(commit_written_staging(root, options).has_value());  // nothing newer is staged
  }
}

// Elastic snapshots written at the step boundary (write_at_save + record_writes, as each node's
// copy under several nodes): every save is committed by the next poll(), and with
// recycle_pruned the pruned snapshot's shard files are written over by the next save (the same
// inodes), not freed and made anew.
TEST(CollectiveAsyncSaver, SnapshotsWrittenAtTheBoundaryCommitAndWriteOverThePrunedFiles) {
  const fs::path root = testing::scratch_dir("async_at_boundary");
  const CommitOptions options{
      .keep_last = 1, .record_writes = true, .write_at_save = true, .recycle_pruned = true};
  auto inode = [](const fs::path& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 ? st.st_ino : ino_t(0);
  };
  std::vector<ino_t> pruned(2), reused(2);
  std::vector<std::optional<fs::path>> committed(2);
  run_ranks(2, [&](Communicator& world) {
    Arena arena("test");
    Tensor t = Tensor::empty(arena, {16, 8}, DType::kF32);
    CollectiveAsyncSaver saver(root, world, options);
    const int rank = world.rank();
    auto save = [&](int64_t step) {
      save_half(saver, t, rank, step);
      EXPECT_TRUE(saver.poll());  // both shards were written in save(): committed now
    };
    save(1);
    pruned[size_t(rank)] = inode(root / "step_1" / rank_file_name(rank));
    save(2);  // the lead prunes step 1 into recycled/ when it commits step 2
    save(3);  // written over step 1's files
    reused[size_t(rank)] = inode(root / "step_3" / rank_file_name(rank));
    committed[size_t(rank)] = saver.last_committed();
  });
  EXPECT_EQ(CheckpointRoot(root).committed_steps(), (std::vector<int64_t>{3}));
  EXPECT_EQ(committed[0], root / "step_3");
  EXPECT_EQ(committed[1], root / "step_3");
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(pruned[size_t(r)], ino_t(0));
    EXPECT_EQ(reused[size_t(r)], pruned[size_t(r)]) << "rank " << r << " wrote a new file";
  }
  Arena arena("read");
  Tensor back = Tensor::empty(arena, {16, 8}, DType::kF32);
  CheckpointReader(root / "step_3").read_global("t", back);
  for (int64_t i = 0; i < back.numel(); ++i) ASSERT_EQ(back.data<float>()[i], float(3000 + i));
  EXPECT_EQ(newest_restorable_step(root), 3);
}

}  // namespace
}  // namespace lattice
