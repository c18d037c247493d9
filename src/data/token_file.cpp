#include "data/token_file.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <vector>

#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "core/error.h"

namespace lattice {

// The on-disk integers are little-endian and read in place.
static_assert(std::endian::native == std::endian::little,
              "token files assume a little-endian host");

void write_token_file(const std::filesystem::path& path, std::span<const int32_t> tokens) {
  std::array<int32_t, kTokenFileHeaderInts> header{};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  if (tokens.size() > size_t(INT32_MAX)) {
    LATTICE_THROW(ValueError, "cannot write '{}': {} tokens exceed the format's int32 count",
                  path.string(), tokens.size());
  }
  header[2] = int32_t(tokens.size());

  AtomicFileWriter out(path);
  out.write(header.data(), sizeof header);
  // Narrow to uint16 a chunk at a time, so the copy stays small for any corpus size.
  constexpr size_t kChunk = size_t(1) << 16;
  std::vector<uint16_t> chunk;
  chunk.reserve(kChunk);
  for (size_t begin = 0; begin < tokens.size(); begin += kChunk) {
    size_t end = std::min(tokens.size(), begin + kChunk);
    chunk.clear();
    for (size_t i = begin; i < end; ++i) {
      int32_t t = tokens[i];
      if (t < 0 || t >= kTokenFileMaxVocab) {
        LATTICE_THROW(ValueError,
                      "cannot write '{}': token {} at position {} does not fit the format's "
                      "uint16 tokens (vocabulary at most {})",
                      path.string(), t, i, kTokenFileMaxVocab);
      }
      chunk.push_back(uint16_t(t));
    }
    out.write(chunk.data(), chunk.size() * sizeof(uint16_t));
  }
  out.commit();
}

TokenFile::TokenFile(std::vector<uint16_t> tokens, std::filesystem::path name)
    : path_(std::move(name)),
      owned_(std::move(tokens)),
      tokens_(owned_.data()),
      count_(int64_t(owned_.size())) {}

TokenFile::TokenFile(std::filesystem::path path) : path_(path), file_(std::in_place, path) {
  const std::string name = path_.string();
  const size_t bytes = file_->size();
  if (bytes < kTokenFileHeaderBytes) {
    LATTICE_THROW(IoError,
                  "token file '{}' is truncated: {} bytes, shorter than its {}-byte header", name,
                  bytes, kTokenFileHeaderBytes);
  }
  std::array<int32_t, kTokenFileHeaderInts> header{};
  std::memcpy(header.data(), file_->bytes().data(), kTokenFileHeaderBytes);
  if (header[0] != kTokenFileMagic) {
    LATTICE_THROW(IoError,
                  "'{}' is not a token file: magic number {}, expected {} (llm.c's layout) "
                  "---> HINT: make it with `lattice data prepare`",
                  name, header[0], kTokenFileMagic);
  }
  if (header[1] != kTokenFileVersion) {
    LATTICE_THROW(IoError,
                  "token file '{}' has version {}, expected {} (uint16 tokens); version 2 is "
                  "llm.c's uint32 layout, which Lattice does not read",
                  name, header[1], kTokenFileVersion);
  }
  const int64_t count = header[2];
  if (count < 0) {
    LATTICE_THROW(IoError, "token file '{}' is corrupted: negative token count {}", name, count);
  }
  const size_t body = bytes - kTokenFileHeaderBytes;
  const size_t expected = size_t(count) * sizeof(uint16_t);
  if (expected > body) {
    LATTICE_THROW(IoError,
                  "token file '{}' is truncated: its header says {} tokens ({} bytes) but only {} "
                  "bytes follow the header ---> HINT: prepare the file again",
                  name, count, expected, body);
  }
  if (expected < body) {
    LATTICE_THROW(IoError,
                  "token file '{}' is corrupted: {} bytes follow its {} tokens, expected none "
                  "(the header's count or the file's length is wrong)",
                  name, body - expected, count);
  }
  // The mapping is page-aligned and the header is 1024 bytes, so the tokens are aligned.
  tokens_ = reinterpret_cast<const uint16_t*>(file_->bytes().data() + kTokenFileHeaderBytes);
  count_ = count;
}

int64_t TokenFile::find_token_at_least(int64_t limit) const {
  for (int64_t i = 0; i < count_; ++i) {
    if (tokens_[i] >= limit) return i;
  }
  return -1;
}

uint32_t TokenFile::content_checksum() const {
  const std::span<const std::byte> bytes = std::as_bytes(tokens());
  if (bytes.size() <= kWholeChecksumBytes) return crc32c(bytes);
  const size_t block = kWholeChecksumBytes / kChecksumBlocks;
  const size_t stride = (bytes.size() - block) / (kChecksumBlocks - 1);
  uint32_t crc = 0;
  for (size_t i = 0; i < kChecksumBlocks; ++i) {
    // The last block ends at the last byte.
    const size_t begin = i + 1 == kChecksumBlocks ? bytes.size() - block : i * stride;
    crc = crc32c_extend(crc, bytes.subspan(begin, block));
  }
  return crc;
}

}  // namespace lattice
