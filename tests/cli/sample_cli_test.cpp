// `lattice sample` through the executable: the prompt and the asked number of tokens, the same
// draws for the same seed; bad values and checkpoints refused.
#include <gtest/gtest.h>

#include <string>

#include "cli/tiny_run.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 60;

std::vector<std::string> sample(const std::filesystem::path& ckpt, std::vector<std::string> extra) {
  std::vector<std::string> args = {LATTICE_EXECUTABLE, "sample", "--ckpt", ckpt.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(SampleCli, PrintsThePromptFollowedByTheAskedNumberOfTokens) {
  const TinyRun run = train_tiny_run("sample", 2);
  ASSERT_EQ(run.result.exit_code, 0) << run.result.all();
  // Byte tokenizer: one byte per token; stdout is the text and a newline.
  const CliResult r = run_cli(
      sample(run.final_dir, {"--prompt", "to be", "--tokens", "40", "--seed", "7"}), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  ASSERT_EQ(r.out.size(), 5u + 40u + 1u) << r.out;
  EXPECT_EQ(r.out.substr(0, 5), "to be");
  EXPECT_EQ(r.out.back(), '\n');
  // A draw is a pure function of (seed, position): 10 tokens are the first 10 of the 40.
  const CliResult shorter = run_cli(
      sample(run.final_dir, {"--prompt", "to be", "--tokens", "10", "--seed", "7"}), kLimitS);
  ASSERT_EQ(shorter.exit_code, 0) << shorter.all();
  EXPECT_EQ(shorter.out, r.out.substr(0, 15) + "\n");
}

TEST(SampleCli, NegativeTokenCountIsRefused) {
  const auto dir = scratch_dir("sample_negative");
  const CliResult r = run_cli(sample(dir, {"--tokens", "-3"}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("--tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--tokens: must be 0 or more, got -3"), std::string::npos) << r.err;
}

TEST(SampleCli, DirectoryThatIsNoCheckpointIsNamed) {
  const auto dir = scratch_dir("sample_not_a_checkpoint");
  const CliResult r = run_cli(sample(dir, {"--tokens", "5"}), kLimitS);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_NE(r.err.find((dir / "manifest.json").string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HINT: a directory without a manifest"), std::string::npos) << r.err;
}

TEST(SampleCli, MissingCheckpointDirectoryIsRefused) {
  const std::string missing = (scratch_dir("sample_missing") / "final").string();
  const CliResult r = run_cli(sample(missing, {"--tokens", "5"}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("--ckpt: Directory does not exist: " + missing), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lattice::testing
