// Bucket planning: contiguous ranges at parameter boundaries, in flat order, of the asked size.
#include "parallel/grad_buckets.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace lattice {
namespace {

std::vector<FlatRange> ranges_of(const std::vector<int64_t>& sizes) {
  std::vector<FlatRange> ranges;
  int64_t at = 0;
  for (int64_t s : sizes) {
    ranges.push_back({at, at + s});
    at += s;
  }
  return ranges;
}

TEST(GradBuckets, FillUpToTheSizeAtParameterBoundaries) {
  auto buckets = plan_grad_buckets(ranges_of({3, 4, 10, 1, 1, 2}), 6);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].begin, 0);  // 3 + 4 = 7 >= 6 closes it
  EXPECT_EQ(buckets[0].end, 7);
  EXPECT_EQ(buckets[0].first_param, 0);
  EXPECT_EQ(buckets[0].end_param, 2);
  EXPECT_EQ(buckets[1].begin, 7);  // a parameter larger than the size stands alone
  EXPECT_EQ(buckets[1].end, 17);
  EXPECT_EQ(buckets[1].first_param, 2);
  EXPECT_EQ(buckets[1].end_param, 3);
  EXPECT_EQ(buckets[2].begin, 17);
  EXPECT_EQ(buckets[2].end, 21);
  EXPECT_EQ(buckets[2].end_param, 6);
}

TEST(GradBuckets, TileTheWholeBufferForAnySize) {
  const auto params = ranges_of({5, 1, 7, 7, 2, 9, 3, 3, 16});
  for (int64_t size : {0, 1, 2, 8, 13, 100}) {
    auto buckets = plan_grad_buckets(params, size);
    int64_t at = 0;
    int param = 0;
    for (const GradBucket& b : buckets) {
      EXPECT_EQ(b.begin, at) << "size " << size;
      EXPECT_EQ(b.first_param, param) << "size " << size;
      EXPECT_EQ(b.begin, params[size_t(b.first_param)].begin);
      EXPECT_EQ(b.end, params[size_t(b.end_param - 1)].end);
      at = b.end;
      param = b.end_param;
    }
    EXPECT_EQ(at, 53) << "size " << size;
    EXPECT_EQ(param, 9) << "size " << size;
    const size_t expected_count = size == 0 ? 1u : size == 1 ? 9u : buckets.size();
    EXPECT_EQ(buckets.size(), expected_count);
  }
}

TEST(GradBuckets, RejectsAGapInTheLayout) {
  std::vector<FlatRange> params{{0, 4}, {5, 8}};
  EXPECT_THROW(plan_grad_buckets(params, 4), ValueError);
}

}  // namespace
}  // namespace lattice
