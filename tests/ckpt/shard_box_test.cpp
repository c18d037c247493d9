// Boxes of a global tensor (format v3): a flat range splits into contiguous boxes that tile it,
// copies between strided placements move exactly the common elements, and a local tensor's
// placements (multi-piece specs, padding, ZeRO ranges of it) agree with for_each_shard_run.
#include "ckpt/shard_box.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"

namespace lattice {
namespace {

std::vector<int64_t> strides_of(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) s[d - 1] = s[d] * dims[d];
  return s;
}

// Flat indices of a box's elements in row-major order of the tensor `dims`.
std::vector<int64_t> flat_indices(const ShardBox& box, const std::vector<int64_t>& dims) {
  std::vector<int64_t> out;
  const std::vector<int64_t> strides = strides_of(dims);
  std::vector<int64_t> index(dims.size(), 0);
  for (int64_t n = 0; n < box.numel(); ++n) {
    int64_t at = 0;
    for (size_t d = 0; d < dims.size(); ++d) at += (box.offsets[d] + index[d]) * strides[d];
    out.push_back(at);
    for (size_t d = dims.size(); d-- > 0;) {
      if (++index[d] < box.lengths[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

TEST(ShardBox, FlatRangeBoxesAreContiguousAndTileTheRangeInOrder) {
  const std::vector<Shape> shapes = {Shape{7}, Shape{3, 5}, Shape{2, 3, 4}, Shape{2, 1, 3, 2}};
  for (const Shape& shape : shapes) {
    const int64_t n = shape.numel();
    for (int64_t b = 0; b <= n; ++b) {
      for (int64_t e = b; e <= n; ++e) {
        std::vector<ShardBox> boxes = flat_range_boxes(shape, b, e);
        ASSERT_LE(boxes.size(), size_t(std::max(1, 2 * shape.rank() - 1)));
        int64_t next = b;
        for (const ShardBox& box : boxes) {
          ASSERT_EQ(box.rank(), shape.rank());
          for (int64_t i : flat_indices(box, shape.dims())) {
            ASSERT_EQ(i, next++) << shape.to_string() << " [" << b << ", " << e << ") "
                                 << box.to_string();
          }
        }
        ASSERT_EQ(next, e) << shape.to_string() << " [" << b << ", " << e << ")";
      }
    }
  }
}

TEST(ShardBox, BoxesOfAnotherRankOrOutsideTheTensorAreRefusedNamingIt) {
  EXPECT_EQ(as_tensor_boxes(ShardBox::flat(3, 9), Shape{4, 4}, "t").size(), 3u);  // 3, 4..7, 8
  EXPECT_THROW(as_tensor_boxes(ShardBox::flat(10, 20), Shape{4, 4}, "t"), ValueError);
  EXPECT_THROW(as_tensor_boxes(ShardBox{{0, 0}, {5, 4}}, Shape{4, 4}, "t"), ValueError);
  try {
    as_tensor_boxes(ShardBox{{0, 0, 0}, {1, 1, 1}}, Shape{4, 4}, "tensor 'w'");
    FAIL() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'w': box [0:1, 0:1, 0:1] has rank 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(ShardBox::flat(0, 16).covers_whole(Shape{4, 4}));
  EXPECT_TRUE(ShardBox::flat(0, 16).is_flat_range_of(Shape{4, 4}));
  EXPECT_FALSE(ShardBox::flat(0, 4).is_flat_range_of(Shape{4}));
}

TEST(ShardBox, CopyOverlapMovesExactlyTheCommonElementsBetweenStridedPlacements) {
  // Global (6, 8) with value 100·row + col; source: box [1:5, 2:7] stored contiguously;
  // destination: box [3:6, 0:4] inside a (4, 10) buffer at row 1, column 5 (strided).
  ShardBox src_box{{1, 2}, {4, 5}};
  std::vector<float> src(size_t(src_box.numel()));
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 5; ++c) src[size_t(r * 5 + c)] = float(100 * (r + 1) + (c + 2));
  }
  std::vector<float> dst(40, -1.0f);
  BoxPlacement to{ShardBox{{3, 0}, {3, 4}},
                  {10, 1},
                  reinterpret_cast<std::byte*>(dst.data() + 1 * 10 + 5),
                  DType::kF32};
  EXPECT_FALSE(to.contiguous());
  const int64_t copied = copy_overlap(
      contiguous_placement(src_box, reinterpret_cast<std::byte*>(src.data()), DType::kF32), to);
  EXPECT_EQ(copied, 2 * 2);  // rows 3..4, columns 2..3
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 10; ++c) {
      const int64_t global_row = r - 1 + 3, global_col = c - 5;
      const bool common =
          r >= 1 && global_row >= 3 && global_row <= 4 && global_col >= 2 && global_col <= 3;
      EXPECT_EQ(dst[size_t(r * 10 + c)], common ? float(100 * global_row + global_col) : -1.0f)
          << r << "," << c;
    }
  }
}

TEST(ShardBox, LocalPlacementsOfAMultiPiecePaddedShardMatchForEachShardRun) {
  // A (5, 12) tensor split along dim 1 into three pieces (a q|k|v-like shard) plus 2 padding
  // columns: local (5, 8). And a (10, 3) one split along dim 0 with 2 padding rows.
  struct Case {
    Shape global;
    ShardSpec spec;
  };
  const std::vector<Case> cases = {
      {Shape{5, 12}, ShardSpec{1, {{2, 2}, {6, 1}, {10, 2}}, 3}},
      {Shape{10, 3}, ShardSpec{0, {{6, 4}}, 2}},
      {Shape{4, 6}, replicated_shard()},
  };
  for (const Case& c : cases) {
    const Shape local = c.spec.local_shape(c.global);
    std::vector<int64_t> expected(size_t(local.numel()), -1);  // local index -> global index
    for_each_shard_run(c.global, c.spec, [&](int64_t g, int64_t l, int64_t n) {
      for (int64_t k = 0; k < n; ++k) expected[size_t(l + k)] = g + k;
    });
    // Every local range, as a ZeRO partition would cut it.
    for (int64_t b = 0; b <= local.numel(); b += 3) {
      for (int64_t e = b; e <= local.numel(); e += 5) {
        std::vector<float> data(size_t(e - b));
        std::iota(data.begin(), data.end(), float(b));  // each element holds its local index
        Tensor t = Tensor::borrow(data.data(), Shape{e - b}, DType::kF32);
        std::vector<int64_t> seen(size_t(local.numel()), -1);
        for (const BoxPlacement& p : local_placements(c.global, c.spec, t, b, e)) {
          // Read each placement into a contiguous box and map its elements back.
          std::vector<float> out(size_t(p.box.numel()));
          copy_overlap(p, contiguous_placement(p.box, reinterpret_cast<std::byte*>(out.data()),
                                               DType::kF32));
          std::vector<int64_t> globals = flat_indices(p.box, c.global.dims());
          for (size_t k = 0; k < out.size(); ++k) {
            auto li = size_t(out[k]);
            ASSERT_EQ(seen[li], -1) << "local element " << li << " placed twice";
            seen[li] = globals[k];
          }
        }
        for (int64_t li = 0; li < local.numel(); ++li) {
          const int64_t want = li >= b && li < e ? expected[size_t(li)] : -1;
          ASSERT_EQ(seen[size_t(li)], want)
              << c.spec.describe() << " range [" << b << ", " << e << ") local " << li;
        }
      }
    }
  }
}

}  // namespace
}  // namespace lattice
