// What `lattice train` shows while it runs, through the executable: the time left on the
// progress lines, and the one-line warning when a rank straggles (a rank slowed by 50 ms in
// every forward, LATTICE_FAULT=slow, under mpirun).
#include <gtest/gtest.h>

#include <string>

#include "cli/cli_run.h"
#include "support/scratch_dir.h"
#include "train/test_corpus.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 120;

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(ObservabilityCli, ProgressLinesSayTheTimeLeftAndAPipeGetsNoBar) {
  const auto data = make_corpus_dir("observability_eta", 8000, 2000);
  const auto config = write_tiny_config(data, 4, "");
  const CliResult r = run_cli(
      train_args(config, scratch_dir("observability_eta_out"), {"--set", "train.log_interval=1"}),
      kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(count(r.out, "| ETA "), 3u) << r.out;           // steps 1-3; the last has nothing left
  EXPECT_EQ(r.out.find("[#"), std::string::npos) << r.out;  // stdout is not a terminal
}

TEST(ObservabilityCli, AStragglingRankIsNamedOnceInALine) {
  const auto data = make_corpus_dir("observability_straggler", 8000, 2000);
  const auto config = write_tiny_config(data, 8, "");
  const CliResult r =
      run_cli({LATTICE_MPIEXEC, "-np", "2", "--oversubscribe", "--allow-run-as-root", "-x",
               "LATTICE_FAULT", LATTICE_EXECUTABLE, "train", config.string(), "--dp", "2",
               "--transport", "mpi", "--set", "output.dir=", "--set", "sample.tokens=0"},
              kLimitS, {"LATTICE_FAULT=slow@forward:1:0"});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(count(r.all(), "straggler: rank 1 was busy"), 1u) << r.all();
  EXPECT_EQ(count(r.all(), "straggler: rank 0"), 0u) << r.all();
}

}  // namespace
}  // namespace lattice::testing
