// The static engine never hangs: under mpirun a rank that dies, stops or throws ends every
// rank with a non-zero exit and the named error within the collective timeout + 2 s. Under
// `lattice launch -- train ... --transport mpi` the agent then relaunches the whole job from its
// newest checkpoint (restart-all), which ends bitwise as the uninterrupted job.
#include <gtest/gtest.h>
#include <unistd.h>

#include "cli/cli_run.h"
#include "train/test_corpus.h"

namespace lattice::testing {
namespace {

class MpiStatic : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    data_ =
        new std::filesystem::path(make_corpus_dir("mpi_static_cli_" + std::to_string(::getpid())));
    config_ =
        new std::filesystem::path(write_tiny_config(*data_, 30, "[parallel]\ntimeout_s = 1\n"));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*data_);
    delete data_;
    delete config_;
  }
  static std::filesystem::path* data_;
  static std::filesystem::path* config_;
};
std::filesystem::path* MpiStatic::data_ = nullptr;
std::filesystem::path* MpiStatic::config_ = nullptr;

TEST_P(MpiStatic, AFailedRankEndsTheJobWithoutAHang) {
  const std::string fault = GetParam();
  const CliResult r =
      run_cli({LATTICE_MPIEXEC, "-np", "2", "--oversubscribe", "--allow-run-as-root", "-x",
               "LATTICE_FAULT", LATTICE_EXECUTABLE, "train", config_->string(), "--dp", "2",
               "--transport", "mpi", "--set", "output.dir="},
              60, {"LATTICE_FAULT=" + fault});
  EXPECT_FALSE(r.timed_out) << r.all();
  EXPECT_NE(r.exit_code, 0) << r.all();
  // The collective timeout (1 s) + 2 s, and the start of two processes, generously.
  EXPECT_LT(r.seconds, 20.0) << r.all();
  EXPECT_EQ(r.all().find("Segmentation fault"), std::string::npos) << r.all();
  EXPECT_EQ(r.all().find("step 30/30"), std::string::npos) << r.all();
  if (fault.starts_with("stop")) {
    EXPECT_NE(r.err.find("timed out after 1000 ms on rank 0: rank 1 did not answer"),
              std::string::npos)
        << r.err;
  }
  if (fault.starts_with("throw")) {
    EXPECT_NE(r.err.find("injected fault throw@backward:1:3"), std::string::npos) << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Faults, MpiStatic,
                         ::testing::Values("stop@forward:1:3", "kill@backward:1:3",
                                           "throw@backward:1:3", "hang@optimizer:0:2"),
                         [](const auto& info) {
                           std::string name = info.param.substr(0, info.param.find('@'));
                           return name;
                         });

// Restart-all: rank 1 killed at step 10 ends the mpirun; the agent runs it again with --resume
// auto from the checkpoint of step 8, and the final state is the uninterrupted job's, bitwise.
TEST(MpiUnderLaunch, AKilledRankRelaunchesTheJobFromItsCheckpointBitwise) {
  const auto data = make_corpus_dir("mpi_launch_cli_" + std::to_string(::getpid()));
  const auto config = write_tiny_config(data, 16, "[eval]\ninterval = 0\n");
  auto launch = [&](const std::filesystem::path& out) {
    return std::vector<std::string>{LATTICE_EXECUTABLE,
                                    "launch",
                                    "--nproc-per-node",
                                    "2",
                                    "--",
                                    "train",
                                    config.string(),
                                    "--dp",
                                    "2",
                                    "--transport",
                                    "mpi",
                                    "--deterministic",
                                    "--set",
                                    "output.checkpoint_every=4",
                                    "--set",
                                    "output.dir=" + out.string()};
  };
  const auto base = data / "uninterrupted";
  const auto faulty = data / "relaunched";
  const CliResult r0 = run_cli(launch(base), 120);
  ASSERT_EQ(r0.exit_code, 0) << r0.all();
  const CliResult r = run_cli(launch(faulty), 120, {"LATTICE_FAULT=kill@backward:1:10"});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.err.find("relaunching all 2 ranks from the newest checkpoint"), std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("at step 8"), std::string::npos) << r.out;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = "final/rank_0000" + std::to_string(rank) + ".safetensors";
    EXPECT_TRUE(same_bytes(base / file, faulty / file)) << file;
  }
  std::filesystem::remove_all(data);
}

}  // namespace
}  // namespace lattice::testing
