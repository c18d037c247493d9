#include "data/byte_tokenizer.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace lattice {
namespace {

TEST(ByteTokenizer, TokenIsTheByteValueAndDecodeInvertsEncode) {
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  ByteTokenizer tokenizer;
  std::vector<int32_t> tokens = tokenizer.encode(all_bytes);
  ASSERT_EQ(tokens.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(tokens[size_t(b)], b);
  EXPECT_EQ(tokenizer.decode(tokens), all_bytes);
  EXPECT_EQ(tokenizer.encode("Hi!"), (std::vector<int32_t>{72, 105, 33}));
  EXPECT_EQ(tokenizer.vocab_size(), 256);
}

TEST(ByteTokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  ByteTokenizer tokenizer;
  std::vector<int32_t> bad{65, 256};
  try {
    tokenizer.decode(bad);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("token 256 at position 1"), std::string::npos) << e.what();
  }
  std::vector<int32_t> negative{-1};
  EXPECT_THROW(tokenizer.decode(negative), ValueError);
}

TEST(Tokenizer, FactoryKnowsByteAndNamesTheChoicesOtherwise) {
  EXPECT_EQ(make_tokenizer("byte")->name(), "byte");
  try {
    make_tokenizer("gpt2-bpe");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("known: byte"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lattice
