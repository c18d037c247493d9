// Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy
// as 1, 2, 3", SC 2011).
//
// Every draw is a pure function of (seed, key, element index), so a rank can initialise its
// shard of a tensor without generating the rest, and any sharding holds the same numbers
// (DESIGN.md invariant 1). `key` is usually hash_name(parameter name).
//
// Layout: the Philox key is the 64-bit seed; the 128-bit counter is (block index, key).
//   uniform element i: word i % 4 of block i / 4, as (u >> 8) * 2^-24 in [0, 1).
//   normal element i:  Box-Muller on words 2(i % 2), 2(i % 2) + 1 of block i / 2 (domain-
//                      separated from uniform draws by a constant folded into the key).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace lattice {

using PhiloxBlock = std::array<uint32_t, 4>;

// One Philox4x32-10 evaluation.
PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<uint32_t, 2> key);

// 64-bit FNV-1a of a name, the `key` for a parameter's draws.
uint64_t hash_name(std::string_view name);

// Draws for elements [first, first + count) of the stream (seed, key).
void fill_uniform(float* out, int64_t count, uint64_t seed, uint64_t key, int64_t first, float low,
                  float high);
void fill_normal(float* out, int64_t count, uint64_t seed, uint64_t key, int64_t first, float mean,
                 float stddev);
float uniform_at(uint64_t seed, uint64_t key, int64_t index);  // in [0, 1)
float normal_at(uint64_t seed, uint64_t key, int64_t index);   // N(0, 1)

// A sequential stream over (seed, key) for sampling, shuffling and dropout. Its whole state is
// (seed, key, position), so it can be saved and resumed exactly.
class PhiloxStream {
 public:
  PhiloxStream(uint64_t seed, uint64_t key, uint64_t position = 0)
      : seed_(seed), key_(key), position_(position) {}
  float next_uniform() { return uniform_at(seed_, key_, int64_t(position_++)); }
  uint32_t next_u32();
  // Uniform integer in [0, n) without modulo bias.
  uint64_t next_below(uint64_t n);
  uint64_t position() const { return position_; }

 private:
  uint64_t seed_;
  uint64_t key_;
  uint64_t position_;
};

}  // namespace lattice
