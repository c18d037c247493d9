#include "data/prepare.h"

#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "data/byte_tokenizer.h"
#include "data/token_file.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

using PrepareTest = testing::ScratchDirTest;

std::string tokens_as_text(const TokenFile& file) {
  std::string text;
  for (uint16_t t : file.tokens()) text.push_back(static_cast<char>(t));
  return text;
}

TEST_F(PrepareTest, SplitsTheLastFractionIntoValidation) {
  auto corpus = dir_ / "corpus.txt";
  std::ofstream(corpus, std::ios::binary) << "abcdefghij\n0123456789";  // 21 bytes
  PrepareOptions options;
  options.input = corpus;
  options.out_dir = dir_ / "out" / "nested";
  options.val_fraction = 0.25;
  PrepareResult result = prepare_token_files(options);
  // floor(21 * 0.75) = 15
  EXPECT_EQ(result.train_tokens, 15);
  EXPECT_EQ(result.val_tokens, 6);
  EXPECT_EQ(tokens_as_text(TokenFile(result.train_path)), "abcdefghij\n0123");
  EXPECT_EQ(tokens_as_text(TokenFile(result.val_path)), "456789");
  EXPECT_EQ(result.val_path, options.out_dir / "val.bin");
}

TEST_F(PrepareTest, ZeroFractionLeavesAnEmptyValidationFile) {
  auto corpus = dir_ / "corpus.txt";
  std::ofstream(corpus, std::ios::binary) << "xyz";
  PrepareResult result = prepare_token_files({corpus, dir_, "byte", 0.0});
  EXPECT_EQ(result.train_tokens, 3);
  EXPECT_EQ(TokenFile(result.val_path).size(), 0);
}

// nanoGPT's shakespeare_char prepare.py reports "train has 1,003,854 tokens, val has 111,540".
TEST_F(PrepareTest, TinyShakespeareSplitMatchesNanoGpt) {
  std::filesystem::path corpus = LATTICE_SHARED_DATA_DIR "/tinyshakespeare.txt";
  if (!std::filesystem::exists(corpus)) GTEST_SKIP() << "corpus not present: " << corpus;
  PrepareResult result = prepare_token_files({corpus, dir_, "byte", 0.1});
  EXPECT_EQ(result.train_tokens, 1003854);
  EXPECT_EQ(result.val_tokens, 111540);
  TokenFile train(result.train_path);
  EXPECT_EQ(tokens_as_text(train).substr(0, 14), "First Citizen:");
  EXPECT_EQ(std::filesystem::file_size(result.val_path), 1024u + 2u * 111540u);
}

TEST_F(PrepareTest, BadArgumentsAreNamed) {
  auto corpus = dir_ / "corpus.txt";
  std::ofstream(corpus) << "hello";
  EXPECT_THROW(prepare_token_files({dir_ / "missing.txt", dir_, "byte", 0.1}), IoError);
  EXPECT_THROW(prepare_token_files({corpus, dir_, "byte", 1.0}), ConfigError);
  EXPECT_THROW(prepare_token_files({corpus, dir_, "byte", -0.1}), ConfigError);
  EXPECT_THROW(prepare_token_files({corpus, dir_, "sentencepiece", 0.1}), ConfigError);
  auto empty = dir_ / "empty.txt";
  std::ofstream(empty).close();
  EXPECT_THROW(prepare_token_files({empty, dir_, "byte", 0.1}), ValueError);
}

}  // namespace
}  // namespace lattice
