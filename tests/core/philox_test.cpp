#include "core/philox.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/dtype.h"

namespace lattice {
namespace {

// Known-answer vectors from Random123's kat_vectors for philox4x32_10.
TEST(Philox, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (PhiloxBlock{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

class PhiloxShard : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

// A shard drawn alone equals the same slice of the whole tensor, bit for bit.
TEST_P(PhiloxShard, ShardEqualsSliceOfWhole) {
  const int64_t total = 1037;
  auto [first, count] = GetParam();
  uint64_t key = hash_name("transformer.h.0.attn.c_attn.weight");
  std::vector<float> whole(static_cast<size_t>(total));
  std::vector<float> shard(static_cast<size_t>(count));
  fill_normal(whole.data(), total, 1234, key, 0, 0.0f, 0.02f);
  fill_normal(shard.data(), count, 1234, key, first, 0.0f, 0.02f);
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(float_bits(shard[size_t(i)]), float_bits(whole[size_t(first + i)])) << i;
  }
  fill_uniform(whole.data(), total, 99, key, 0, -1.0f, 1.0f);
  fill_uniform(shard.data(), count, 99, key, first, -1.0f, 1.0f);
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(float_bits(shard[size_t(i)]), float_bits(whole[size_t(first + i)])) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Offsets, PhiloxShard,
                         ::testing::Values(std::pair<int64_t, int64_t>{0, 1037},
                                           std::pair<int64_t, int64_t>{1, 5},
                                           std::pair<int64_t, int64_t>{3, 500},
                                           std::pair<int64_t, int64_t>{518, 519},
                                           std::pair<int64_t, int64_t>{1036, 1}));

TEST(Philox, NormalDrawsHaveUnitMoments) {
  const int64_t n = 200000;
  std::vector<float> v(n);
  fill_normal(v.data(), n, 7, hash_name("x"), 0, 0.0f, 1.0f);
  double sum = 0, sum_sq = 0;
  for (float x : v) sum += x, sum_sq += double(x) * x;
  double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n - mean * mean, 1.0, 0.01);
}

TEST(Philox, UniformDrawsLieInRangeWithRightMean) {
  const int64_t n = 100000;
  std::vector<float> v(n);
  fill_uniform(v.data(), n, 7, hash_name("u"), 0, 2.0f, 4.0f);
  double sum = 0;
  for (float x : v) {
    ASSERT_GE(x, 2.0f);
    ASSERT_LT(x, 4.0f);
    sum += x;
  }
  EXPECT_NEAR(sum / n, 3.0, 0.01);
}

TEST(Philox, DifferentNamesAndSeedsGiveDifferentStreams) {
  EXPECT_NE(normal_at(1, hash_name("a"), 0), normal_at(1, hash_name("b"), 0));
  EXPECT_NE(normal_at(1, hash_name("a"), 0), normal_at(2, hash_name("a"), 0));
  EXPECT_NE(hash_name("a"), hash_name("b"));
}

TEST(PhiloxStream, ResumesFromSavedPosition) {
  PhiloxStream a(5, 6);
  for (int i = 0; i < 13; ++i) a.next_u32();
  PhiloxStream b(5, 6, a.position());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.next_u32(), b.next_u32());
  for (int i = 0; i < 1000; ++i) EXPECT_LT(a.next_below(7), 7u);
}

}  // namespace
}  // namespace lattice
