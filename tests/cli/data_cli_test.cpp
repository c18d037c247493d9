// `lattice data prepare` through the executable: token files that `lattice train` reads, and the
// refusals of bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cli/cli_run.h"
#include "support/scratch_dir.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 60;

// A text corpus of `bytes` bytes: words and newlines, every byte printable ASCII.
std::filesystem::path write_corpus(const std::filesystem::path& dir, size_t bytes) {
  const std::string words = "to be or not to be that is the question\nwhether tis nobler ";
  std::string text;
  while (text.size() < bytes) text += words;
  text.resize(bytes);
  const auto path = dir / "corpus.txt";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(DataPrepareCli, WritesTokenFilesThatTrainReads) {
  const auto dir = scratch_dir("data_prepare");
  const auto corpus = write_corpus(dir, 30000);
  const auto out = dir / "tokens";
  const CliResult r = run_cli({LATTICE_EXECUTABLE, "data", "prepare", "--input", corpus.string(),
                               "--out", out.string(), "--val-fraction", "0.2"},
                              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  // Byte tokenizer: one token per byte, the last 20% in val.bin.
  EXPECT_NE(r.out.find((out / "train.bin").string() + ": 24000 tokens"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find((out / "val.bin").string() + ": 6000 tokens"), std::string::npos) << r.out;
  ASSERT_TRUE(std::filesystem::exists(out / "train.bin"));
  ASSERT_TRUE(std::filesystem::exists(out / "val.bin"));

  // The tiny config reads the prepared directory: two steps train and evaluate on it.
  const auto config = write_tiny_config(out, 2, "[eval]\nbatches = 1\n");
  const auto metrics = dir / "metrics.jsonl";
  const CliResult train = run_cli(train_args(config, "", {"--metrics", metrics.string()}), kLimitS);
  ASSERT_EQ(train.exit_code, 0) << train.all();
  const std::vector<double> losses = metric_values(metrics, "loss");
  ASSERT_EQ(losses.size(), 2u) << read_text(metrics);
  // Byte vocabulary (256) at random init: the first loss is near ln(256) = 5.55.
  EXPECT_NEAR(losses[0], 5.55, 0.5);
  EXPECT_EQ(metric_values(metrics, "val_loss").size(), 1u) << read_text(metrics);
}

TEST(DataPrepareCli, MissingInputIsNamed) {
  const auto dir = scratch_dir("data_prepare_missing");
  const std::string missing = (dir / "no_such_corpus.txt").string();
  const CliResult r = run_cli(
      {LATTICE_EXECUTABLE, "data", "prepare", "--input", missing, "--out", (dir / "out").string()},
      kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("--input"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "train.bin"));
}

TEST(DataPrepareCli, ValFractionOutsideZeroToOneIsRefused) {
  const auto dir = scratch_dir("data_prepare_fraction");
  const auto corpus = write_corpus(dir, 1000);
  const CliResult r = run_cli({LATTICE_EXECUTABLE, "data", "prepare", "--input", corpus.string(),
                               "--out", (dir / "out").string(), "--val-fraction", "1.5"},
                              kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("--val-fraction"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1.5"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not in range"), std::string::npos) << r.err;
}

TEST(DataPrepareCli, UnknownTokenizerListsTheKnownOnes) {
  const auto dir = scratch_dir("data_prepare_tokenizer");
  const auto corpus = write_corpus(dir, 1000);
  const CliResult r = run_cli({LATTICE_EXECUTABLE, "data", "prepare", "--input", corpus.string(),
                               "--out", (dir / "out").string(), "--tokenizer", "gpt9"},
                              kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("--tokenizer"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gpt9"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not in {byte}"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lattice::testing
