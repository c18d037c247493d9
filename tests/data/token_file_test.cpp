#include "data/token_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/crc32c.h"
#include "core/error.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

// A reference writer independent of token_file.cpp: llm.c's dev/data/data_common.py
// write_datafile (np.int32 header of 256 values, then np.uint16 tokens), spelled out byte by
// byte in little-endian order.
void put_le(std::string& out, uint32_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
std::string llmc_datafile_bytes(const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                                int32_t version = 1, int64_t count = -1) {
  std::string bytes;
  put_le(bytes, uint32_t(magic), 4);
  put_le(bytes, uint32_t(version), 4);
  put_le(bytes, uint32_t(count < 0 ? int64_t(tokens.size()) : count), 4);
  for (int i = 3; i < 256; ++i) put_le(bytes, 0, 4);
  for (uint16_t t : tokens) put_le(bytes, t, 2);
  return bytes;
}
void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}
std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class TokenFileTest : public testing::ScratchDirTest {
 protected:
  // The IoError message of opening a file holding `bytes`.
  std::string open_error(const std::string& bytes) {
    auto path = dir_ / "bad.bin";
    write_bytes(path, bytes);
    try {
      TokenFile file(path);
    } catch (const IoError& e) {
      std::string message = e.what();
      EXPECT_NE(message.find(path.string()), std::string::npos) << "names the file: " << message;
      return message;
    }
    ADD_FAILURE() << "expected IoError";
    return {};
  }
};

TEST_F(TokenFileTest, FileFromTheLlmcReferenceWriterLoadsUnchanged) {
  std::vector<uint16_t> tokens{0, 1, 255, 256, 50256, 65535, 7};
  auto path = dir_ / "llmc.bin";
  write_bytes(path, llmc_datafile_bytes(tokens));
  TokenFile file(path);
  ASSERT_EQ(file.size(), int64_t(tokens.size()));
  EXPECT_EQ(std::vector<uint16_t>(file.tokens().begin(), file.tokens().end()), tokens);
}

TEST_F(TokenFileTest, WriterProducesExactlyTheLlmcBytes) {
  std::vector<int32_t> tokens{5, 0, 65535, 300, 42};
  auto path = dir_ / "ours.bin";
  write_token_file(path, tokens);
  EXPECT_EQ(read_bytes(path), llmc_datafile_bytes({5, 0, 65535, 300, 42}));
  TokenFile file(path);
  EXPECT_EQ(file.size(), 5);
  EXPECT_EQ(file.tokens()[2], 65535);
}

TEST_F(TokenFileTest, EmptyTokenFileIsValid) {
  auto path = dir_ / "empty.bin";
  write_token_file(path, std::vector<int32_t>{});
  EXPECT_EQ(std::filesystem::file_size(path), kTokenFileHeaderBytes);
  EXPECT_EQ(TokenFile(path).size(), 0);
}

TEST_F(TokenFileTest, WriterRejectsTokensOutsideUint16) {
  EXPECT_THROW(write_token_file(dir_ / "a.bin", std::vector<int32_t>{1, 65536}), ValueError);
  EXPECT_THROW(write_token_file(dir_ / "b.bin", std::vector<int32_t>{-1}), ValueError);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "a.bin"));  // nothing half-written is left
}

TEST_F(TokenFileTest, TruncatedHeaderIsReported) {
  std::string bytes = llmc_datafile_bytes({1, 2, 3}).substr(0, 100);
  EXPECT_NE(open_error(bytes).find("truncated: 100 bytes, shorter than its 1024-byte header"),
            std::string::npos);
}

TEST_F(TokenFileTest, WrongMagicIsReported) {
  std::string message = open_error(llmc_datafile_bytes({1, 2, 3}, 12345));
  EXPECT_NE(message.find("not a token file: magic number 12345, expected 20240520"),
            std::string::npos)
      << message;
}

TEST_F(TokenFileTest, Uint32VersionIsReported) {
  std::string message = open_error(llmc_datafile_bytes({1, 2, 3}, 20240520, 2));
  EXPECT_NE(message.find("version 2, expected 1"), std::string::npos) << message;
}

TEST_F(TokenFileTest, TokenCountLargerThanTheFileIsReported) {
  std::string message = open_error(llmc_datafile_bytes({1, 2, 3}, 20240520, 1, 4));
  EXPECT_NE(message.find("truncated: its header says 4 tokens (8 bytes) but only 6 bytes"),
            std::string::npos)
      << message;
  // The same file cut in the middle of a token.
  std::string cut = llmc_datafile_bytes({1, 2, 3});
  cut.pop_back();
  EXPECT_NE(open_error(cut).find("truncated"), std::string::npos);
}

TEST_F(TokenFileTest, BytesAfterTheLastTokenAreReported) {
  std::string bytes = llmc_datafile_bytes({1, 2, 3}, 20240520, 1, 2);
  EXPECT_NE(open_error(bytes).find("2 bytes follow its 2 tokens"), std::string::npos);
}

TEST_F(TokenFileTest, NegativeCountIsReported) {
  EXPECT_NE(open_error(llmc_datafile_bytes({1}, 20240520, 1, 0xffffffffll)).find("negative"),
            std::string::npos);
}

TEST_F(TokenFileTest, MissingFileIsReported) {
  EXPECT_THROW(TokenFile(dir_ / "nope.bin"), IoError);
}

// The identity a resume compares: the CRC32C of every token up to 64 MiB; above, a sample
// that still sees a change in its blocks (the first and the last token among them) and costs
// the same whatever the size.
TEST(TokenFileChecksum, IsTheTokensCrcUpTo64MibAndASampleThatSeesTheEndsAbove) {
  const std::vector<uint16_t> small = {1, 2, 3, 65535};
  EXPECT_EQ(TokenFile(small, "small").content_checksum(),
            crc32c(std::as_bytes(std::span<const uint16_t>(small))));

  const size_t count = TokenFile::kWholeChecksumBytes / sizeof(uint16_t) * 3 / 2;
  std::vector<uint16_t> big(count);
  for (size_t i = 0; i < count; ++i) big[i] = uint16_t(i * 2654435761u >> 16);
  const uint32_t base = TokenFile(big, "big").content_checksum();
  EXPECT_EQ(TokenFile(big, "copy").content_checksum(), base);
  EXPECT_NE(base, crc32c(std::as_bytes(std::span<const uint16_t>(big))));  // sampled
  for (const size_t at : {size_t(0), count - 1}) {
    std::vector<uint16_t> changed = big;
    changed[at] ^= 1;
    EXPECT_NE(TokenFile(changed, "changed").content_checksum(), base) << at;
  }
}

}  // namespace
}  // namespace lattice
