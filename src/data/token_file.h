// Token files in llm.c's layout (dev/data/data_common.py, write_datafile), so that files
// prepared by llm.c's scripts load unchanged and ours load in llm.c:
//
//   header: 256 little-endian int32 = 1024 bytes: [0] magic 20240520, [1] version 1,
//           [2] token count, the rest zero
//   body:   token count little-endian uint16 tokens (so a vocabulary of at most 65536)
//
// The file is exactly 1024 + 2 * count bytes; anything else is reported as corruption.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include "core/mapped_file.h"

namespace lattice {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr size_t kTokenFileHeaderInts = 256;
inline constexpr size_t kTokenFileHeaderBytes = kTokenFileHeaderInts * sizeof(int32_t);
inline constexpr int64_t kTokenFileMaxVocab = 65536;  // uint16 tokens

// Writes `tokens` (each in [0, 65536), else ValueError naming the position) atomically.
void write_token_file(const std::filesystem::path& path, std::span<const int32_t> tokens);

// A token file mapped read-only, its header validated. Throws IoError naming the file and what
// is wrong: truncated header, wrong magic, unsupported version, a token count larger than the
// file holds, or bytes after the last token.
class TokenFile {
 public:
  explicit TokenFile(std::filesystem::path path);
  // Tokens held in memory (benchmarks, probes): `name` stands for the path in messages.
  TokenFile(std::vector<uint16_t> tokens, std::filesystem::path name);

  const std::filesystem::path& path() const { return path_; }
  int64_t size() const { return count_; }  // tokens
  std::span<const uint16_t> tokens() const { return {tokens_, size_t(count_)}; }
  // The position of the first token id >= `limit` (a vocabulary it does not fit), or -1.
  int64_t find_token_at_least(int64_t limit) const;
  // The tokens' identity, for a resume to tell one training set from another of the same size:
  // CRC32C of their bytes. Above kWholeChecksumBytes a sample instead, so a corpus of any size
  // costs the same: kChecksumBlocks blocks spread evenly from the first token to the last.
  uint32_t content_checksum() const;
  static constexpr size_t kWholeChecksumBytes = size_t(64) << 20;
  static constexpr size_t kChecksumBlocks = 1024;  // of kWholeChecksumBytes / kChecksumBlocks

 private:
  std::filesystem::path path_;
  std::optional<MappedFile> file_;  // a file's tokens, or
  std::vector<uint16_t> owned_;     // tokens in memory
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

}  // namespace lattice
