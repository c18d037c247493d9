#include "core/philox.h"

#include <cmath>

namespace lattice {

namespace {

constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;                   // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;                   // sqrt(3) - 1
constexpr uint64_t kNormalDomain = 0x6e6f726d616c0001ull;  // "normal": keeps normal != uniform

std::array<uint32_t, 2> split(uint64_t v) {
  return {uint32_t(v), uint32_t(v >> 32)};
}

PhiloxBlock block_at(uint64_t seed, uint64_t key, uint64_t block) {
  auto [b0, b1] = split(block);
  auto [k0, k1] = split(key);
  return philox4x32_10({b0, b1, k0, k1}, split(seed));
}

float to_unit(uint32_t u) {
  return float(u >> 8) * 0x1.0p-24f;
}  // [0, 1)

float box_muller(uint32_t a, uint32_t b) {
  // u1 in (0, 1] so the log is finite; computed in double for accuracy.
  double u1 = (double(a >> 8) + 1.0) * 0x1.0p-24;
  double u2 = double(b >> 8) * 0x1.0p-24;
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

}  // namespace

PhiloxBlock philox4x32_10(PhiloxBlock c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(kMultiplier0) * c[0];
    uint64_t p1 = uint64_t(kMultiplier1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
         uint32_t(p0)};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

uint64_t hash_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

void fill_uniform(float* out, int64_t count, uint64_t seed, uint64_t key, int64_t first, float low,
                  float high) {
  float scale = high - low;
  for (int64_t i = 0; i < count; ++i) {
    int64_t index = first + i;
    PhiloxBlock b = block_at(seed, key, uint64_t(index) / 4);
    out[i] = low + scale * to_unit(b[size_t(index % 4)]);
  }
}

void fill_normal(float* out, int64_t count, uint64_t seed, uint64_t key, int64_t first, float mean,
                 float stddev) {
  for (int64_t i = 0; i < count; ++i) out[i] = mean + stddev * normal_at(seed, key, first + i);
}

float uniform_at(uint64_t seed, uint64_t key, int64_t index) {
  PhiloxBlock b = block_at(seed, key, uint64_t(index) / 4);
  return to_unit(b[size_t(index % 4)]);
}

float normal_at(uint64_t seed, uint64_t key, int64_t index) {
  PhiloxBlock b = block_at(seed, key ^ kNormalDomain, uint64_t(index) / 2);
  size_t w = size_t(index % 2) * 2;
  return box_muller(b[w], b[w + 1]);
}

uint32_t PhiloxStream::next_u32() {
  uint64_t index = position_++;
  return block_at(seed_, key_, index / 4)[index % 4];
}

uint64_t PhiloxStream::next_below(uint64_t n) {
  if (n <= 1) return 0;
  // Rejection sampling on 64-bit draws: accept below the largest multiple of n.
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  while (true) {
    uint64_t v = (uint64_t(next_u32()) << 32) | next_u32();
    if (v < limit) return v % n;
  }
}

}  // namespace lattice
