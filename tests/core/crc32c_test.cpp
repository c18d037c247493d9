// CRC32C against the published check values (RFC 3720 B.4 and the CRC catalogue) and against a
// bit-at-a-time reference on every split of a buffer.
#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace lattice {
namespace {

uint32_t reference_crc32c(const std::vector<std::byte>& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (std::byte b : bytes) {
    c ^= uint32_t(b);
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

std::vector<std::byte> filled(size_t n, int (*value)(size_t)) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(value(i));
  return v;
}

TEST(Crc32c, MatchesPublishedCheckValues) {
  EXPECT_EQ(crc32c(std::string_view("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c(filled(32, [](size_t) { return 0; })), 0x8A9136AAu);
  EXPECT_EQ(crc32c(filled(32, [](size_t) { return 0xFF; })), 0x62A8AB43u);
  EXPECT_EQ(crc32c(filled(32, [](size_t i) { return int(i); })), 0x46DD794Eu);
  EXPECT_EQ(crc32c(filled(32, [](size_t i) { return int(31 - i); })), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(std::string_view("")), 0u);
}

TEST(Crc32c, ExtendingAcrossAnySplitEqualsTheReference) {
  std::vector<std::byte> data = filled(77, [](size_t i) { return int((i * 131 + 7) % 251); });
  const uint32_t expected = reference_crc32c(data);
  std::span<const std::byte> all(data);
  for (size_t split = 0; split <= data.size(); ++split) {
    uint32_t c = crc32c_extend(crc32c(all.first(split)), all.subspan(split));
    ASSERT_EQ(c, expected) << "split at " << split;
  }
  data[40] ^= std::byte{1};
  EXPECT_NE(crc32c(data), expected);
}

// The snapshot's copy and checksum in one pass: the destination equals the source and the
// checksum the separate one's, for lengths around the 12 KiB block.
TEST(Crc32c, CopyingWithTheChecksumEqualsCopyThenChecksum) {
  const std::vector<std::byte> data =
      filled(2 * 12288 + 77, [](size_t i) { return int((i * 40503u) >> 8); });
  for (size_t n :
       {size_t(0), size_t(1), size_t(12287), size_t(12288), size_t(12289), data.size()}) {
    const std::span<const std::byte> from = std::span(data).first(n);
    std::vector<std::byte> to(n);
    EXPECT_EQ(copy_with_crc32c(0x77u, from, to.data()), crc32c_extend(0x77u, from)) << n;
    EXPECT_TRUE(std::equal(to.begin(), to.end(), from.begin())) << n;
  }
}

// Both paths give the same checksum for every length and alignment (the hardware one where this
// CPU has it), and the published check value.
TEST(Crc32c, TheHardwarePathEqualsThePortableOne) {
  const std::optional<uint32_t> check =
      crc32c_extend_hardware(0, std::as_bytes(std::span(std::string_view("123456789"))));
  if (!check) GTEST_SKIP() << "this CPU has no crc32 instruction (SSE4.2)";
  EXPECT_EQ(*check, 0xE3069283u);
  const std::vector<std::byte> data =
      filled(1000, [](size_t i) { return int((i * 2654435761u) >> 24); });
  const std::span<const std::byte> all(data);
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 500, 991}) {
      const auto piece = all.subspan(offset, n);
      EXPECT_EQ(*crc32c_extend_hardware(0x1234u, piece), crc32c_extend_portable(0x1234u, piece))
          << "offset " << offset << ", " << n << " bytes";
    }
  }
  EXPECT_EQ(crc32c(data), reference_crc32c(data));
  // Long buffers run three interleaved streams of 4 KiB joined by a shift: every length around
  // the 12 KiB block and its multiples, and a start inside a block.
  const std::vector<std::byte> big =
      filled(3 * 12288 + 100, [](size_t i) { return int((i * 2246822519u) >> 24); });
  const std::span<const std::byte> whole(big);
  for (size_t n : {12287, 12288, 12289, 24576, 24583, 36864, 36964}) {
    for (size_t offset : {0, 3}) {
      const auto piece = whole.subspan(offset, std::min(n, whole.size() - offset));
      EXPECT_EQ(*crc32c_extend_hardware(0xdeadbeefu, piece),
                crc32c_extend_portable(0xdeadbeefu, piece))
          << "offset " << offset << ", " << piece.size() << " bytes";
    }
  }
}

}  // namespace
}  // namespace lattice
