// The commit protocol under crashes: a save interrupted at every stage (the child process
// killed there, or a failure injected there) leaves the previous checkpoint loadable, the
// partial one ignored, and the next save working. Plus `latest` and keep_last.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/shard_reader.h"
#include "ckpt/shard_writer.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

constexpr int kHookReached = 42;

// A checkpoint whose values identify its step: t[i] = 1000·step + i.
struct StepTensors {
  Arena arena{"test"};
  Tensor t = Tensor::empty(arena, {8, 16}, DType::kF32);

  std::vector<OwnedShard> at(int64_t step) {
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(1000 * step + i);
    return {OwnedShard::rows("t", t.shape(), 0, 5, t.slice_rows(0, 5)),
            OwnedShard::rows("t", t.shape(), 5, 8, t.slice_rows(5, 8))};
  }
};

Manifest header(int64_t step) {
  Manifest m;
  m.step = step;
  return m;
}

// Reads back the checkpoint resume_auto picks and returns its step after checking the values.
int64_t resumed_step(const fs::path& root) {
  std::optional<ResumeChoice> choice = resume_auto(root);
  EXPECT_TRUE(choice.has_value());
  if (!choice) return -1;
  EXPECT_TRUE(choice->skipped.empty()) << choice->skipped.front();
  CheckpointReader reader(choice->dir);
  Arena arena("read");
  Tensor t = Tensor::zeros(arena, {8, 16}, DType::kF32);
  reader.read_global("t", t);
  for (int64_t i = 0; i < t.numel(); ++i) {
    EXPECT_EQ(t.data<float>()[i], float(1000 * choice->step + i)) << "element " << i;
  }
  return choice->step;
}

enum class Interruption { kKilledChild, kInjectedFailure };

using CrashCase = std::tuple<CommitStage, Interruption>;
class CrashPointSweep : public ::testing::TestWithParam<CrashCase> {};

TEST_P(CrashPointSweep, PreviousCheckpointSurvivesAndPartialOneIsIgnored) {
  // Not a structured binding: clang 14 cannot capture one in the hooks below.
  const CommitStage stage = std::get<0>(GetParam());
  const Interruption how = std::get<1>(GetParam());
  fs::path root_dir =
      testing::scratch_dir(fmt::format("crash_{}_{}", commit_stage_name(stage),
                                       how == Interruption::kKilledChild ? "kill" : "throw"));
  CheckpointRoot root(root_dir);
  StepTensors tensors;
  const CommitOptions keep_one{.keep_last = 1, .hook = {}};
  save_sharded_checkpoint(root, header(1), tensors.at(1), keep_one);

  CommitOptions interrupted = keep_one;
  if (how == Interruption::kKilledChild) {
    interrupted.hook = [stage](CommitStage reached) {
      if (reached == stage) ::_exit(kHookReached);  // no destructors, no cleanup: a crash
    };
    fflush(nullptr);
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        save_sharded_checkpoint(root, header(2), tensors.at(2), interrupted);
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), kHookReached) << "the save never reached the stage";
  } else {
    interrupted.hook = [stage](CommitStage reached) {
      if (reached == stage) throw IoError("injected failure");
    };
    EXPECT_THROW(save_sharded_checkpoint(root, header(2), tensors.at(2), interrupted), IoError);
  }

  const bool committed = stage >= CommitStage::kDirectoryRenamed;
  EXPECT_EQ(resumed_step(root_dir), committed ? 2 : 1);
  // The previous checkpoint is deleted only by pruning, the protocol's last stage.
  EXPECT_EQ(fs::exists(root.step_dir(1)), stage < CommitStage::kPruned);
  EXPECT_EQ(root.latest_step(), stage >= CommitStage::kLatestUpdated ? 2 : 1);

  // The next save of the same step clears whatever the crash left and commits.
  save_sharded_checkpoint(root, header(2), tensors.at(2), keep_one);
  EXPECT_EQ(resumed_step(root_dir), 2);
  EXPECT_EQ(root.committed_steps(), std::vector<int64_t>{2});
  EXPECT_FALSE(fs::exists(root.staging_dir(2)));
  EXPECT_EQ(root.latest_step(), 2);
}

INSTANTIATE_TEST_SUITE_P(
    EveryStage, CrashPointSweep,
    ::testing::Combine(
        ::testing::Values(CommitStage::kStagingCreated, CommitStage::kShardsWritten,
                          CommitStage::kManifestWritten, CommitStage::kDirectoryRenamed,
                          CommitStage::kLatestUpdated, CommitStage::kPruned),
        ::testing::Values(Interruption::kKilledChild, Interruption::kInjectedFailure)),
    [](const auto& info) {
      std::string name =
          fmt::format("{}_{}", commit_stage_name(std::get<0>(info.param)),
                      std::get<1>(info.param) == Interruption::kKilledChild ? "killed" : "failed");
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return name;
    });

TEST(CommitProtocol, KeepLastPrunesOnlyOlderCheckpointsAfterTheNewOneIsCommitted) {
  fs::path root_dir = testing::scratch_dir("keep_last");
  CheckpointRoot root(root_dir);
  StepTensors tensors;
  std::vector<std::vector<int64_t>> seen_before_prune;
  for (int64_t step = 1; step <= 5; ++step) {
    CommitOptions options{.keep_last = 2, .hook = [&](CommitStage stage) {
                            if (stage == CommitStage::kLatestUpdated) {
                              seen_before_prune.push_back(root.committed_steps());
                            }
                          }};
    save_sharded_checkpoint(root, header(step), tensors.at(step), options);
    EXPECT_EQ(root.latest_step(), step);
  }
  EXPECT_EQ(root.committed_steps(), (std::vector<int64_t>{5, 4}));
  // When step 5 was committed, steps 3 and 4 were both still there.
  EXPECT_EQ(seen_before_prune.back(), (std::vector<int64_t>{5, 4, 3}));
  EXPECT_EQ(resumed_step(root_dir), 5);

  // keep_last = 0 keeps everything.
  save_sharded_checkpoint(root, header(6), tensors.at(6));
  EXPECT_EQ(root.committed_steps(), (std::vector<int64_t>{6, 5, 4}));
}

TEST(CommitProtocol, ForeignAndStagingDirectoriesAreNotCheckpoints) {
  fs::path root_dir = testing::scratch_dir("foreign");
  CheckpointRoot root(root_dir);
  fs::create_directories(root_dir / "step_9.tmp");
  fs::create_directories(root_dir / "step_x");
  fs::create_directories(root_dir / "notes");
  EXPECT_TRUE(root.committed_steps().empty());
  EXPECT_FALSE(resume_auto(root_dir).has_value());
  EXPECT_FALSE(root.latest_step().has_value());
}

// An elastic rank of a replaced generation (docs/elastic.md, fencing) refuses to commit: the
// fence throws before the rename, and the previous checkpoint stays the newest.
TEST(CommitFence, AFenceThatThrowsRefusesTheCommit) {
  const fs::path root_dir = testing::scratch_dir("commit_fence");
  CheckpointRoot root(root_dir);
  StepTensors tensors;
  save_sharded_checkpoint(root, header(1), tensors.at(1), {});
  int fenced = 0;
  CommitOptions options;
  options.fence = [&] {
    ++fenced;
    throw CommError("generation 0 was replaced by generation 1 (fenced)");
  };
  EXPECT_THROW(save_sharded_checkpoint(root, header(2), tensors.at(2), options), CommError);
  EXPECT_EQ(fenced, 1);
  EXPECT_FALSE(fs::exists(root.step_dir(2)));
  EXPECT_EQ(resumed_step(root_dir), 1);
  options.fence = [&] { ++fenced; };  // a current generation commits
  save_sharded_checkpoint(root, header(2), tensors.at(2), options);
  EXPECT_EQ(fenced, 2);
  EXPECT_EQ(resumed_step(root_dir), 2);
}

}  // namespace
}  // namespace lattice
