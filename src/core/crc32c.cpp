#include "core/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace lattice {

namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

// Slicing-by-8 (Kounavis & Berry, Intel 2005): table k maps a byte to its CRC contribution k
// bytes further on, so eight bytes are folded per step instead of one (several GB/s in
// portable code; checkpoints of hundreds of MB are checksummed while they are written).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPolynomial : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
  }
  return t;
}

constexpr Tables kTables = make_tables();

}  // namespace

uint32_t crc32c_extend_portable(uint32_t crc, std::span<const std::byte> bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size();
  uint32_t c = ~crc;
  while (n >= 8) {
    uint32_t lo = 0, hi = 0;
    std::memcpy(&lo, p, 4);  // little-endian hosts only (safetensors.cpp asserts the same)
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = kTables[7][lo & 0xffu] ^ kTables[6][(lo >> 8) & 0xffu] ^ kTables[5][(lo >> 16) & 0xffu] ^
        kTables[4][lo >> 24] ^ kTables[3][hi & 0xffu] ^ kTables[2][(hi >> 8) & 0xffu] ^
        kTables[1][(hi >> 16) & 0xffu] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xffu];
  return ~c;
}

#if defined(__x86_64__)
namespace {

// The crc32 instruction has a latency of 3 cycles and a throughput of 1: one chain of them runs
// at a third of the rate. Three independent chains over three consecutive blocks of kStream
// bytes, started from the running register and from zero, are joined by the register update's
// linearity: crc(A ‖ B) = shift_|B|(crc(A)) ⊕ crc₀(B), shift_n being n zero bytes fed through it.
constexpr size_t kStream = 4096;

// shift_kStream on a 32-bit register as four byte tables: entry [j][b] is the shifted value of
// the register holding byte b at byte position j.
using ShiftTables = std::array<std::array<uint32_t, 256>, 4>;

__attribute__((target("sse4.2"))) ShiftTables make_shift_tables() {
  std::array<uint32_t, 32> column{};
  for (int bit = 0; bit < 32; ++bit) {
    uint64_t c = uint64_t(1) << bit;
    for (size_t i = 0; i < kStream / 8; ++i) c = _mm_crc32_u64(c, 0);
    column[size_t(bit)] = uint32_t(c);
  }
  ShiftTables t{};
  for (size_t j = 0; j < 4; ++j) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (int k = 0; k < 8; ++k) {
        if (b & (1u << k)) v ^= column[j * 8 + size_t(k)];
      }
      t[j][b] = v;
    }
  }
  return t;
}

uint32_t shift_stream(const ShiftTables& t, uint32_t c) {
  return t[0][c & 0xffu] ^ t[1][(c >> 8) & 0xffu] ^ t[2][(c >> 16) & 0xffu] ^ t[3][c >> 24];
}

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc,
                                                        std::span<const std::byte> bytes) {
  static const ShiftTables shift = make_shift_tables();
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size();
  uint64_t c = ~crc;
  while (n >= 3 * kStream) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStream; i += 8) {
      uint64_t w0 = 0, w1 = 0, w2 = 0;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kStream + i, 8);
      std::memcpy(&w2, p + 2 * kStream + i, 8);
      c = _mm_crc32_u64(c, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    c = shift_stream(shift, shift_stream(shift, uint32_t(c)) ^ uint32_t(c1)) ^ uint32_t(c2);
    p += 3 * kStream;
    n -= 3 * kStream;
  }
  while (n >= 8) {
    uint64_t word = 0;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  auto c32 = uint32_t(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

}  // namespace
#endif

std::optional<uint32_t> crc32c_extend_hardware(uint32_t crc, std::span<const std::byte> bytes) {
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return crc32c_sse42(crc, bytes);
#endif
  return std::nullopt;
}

uint32_t crc32c_extend(uint32_t crc, std::span<const std::byte> bytes) {
  if (const std::optional<uint32_t> fast = crc32c_extend_hardware(crc, bytes)) return *fast;
  return crc32c_extend_portable(crc, bytes);
}

uint32_t copy_with_crc32c(uint32_t crc, std::span<const std::byte> from, std::byte* to) {
  // Small enough to stay in the first-level cache between the copy and the checksum, a whole
  // number of the three-chain kernel's blocks.
  constexpr size_t kBlock = 3 * 4096;
  for (size_t done = 0; done < from.size(); done += kBlock) {
    const size_t n = std::min(kBlock, from.size() - done);
    std::memcpy(to + done, from.data() + done, n);
    crc = crc32c_extend(crc, {to + done, n});
  }
  return crc;
}

}  // namespace lattice
