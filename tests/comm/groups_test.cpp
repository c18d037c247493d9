// Process groups: split and new_group make the same groups on every member, and groups run
// their collectives independently, also at the same time.
#include <gtest/gtest.h>

#include "comm/thread_world.h"

namespace lattice {
namespace {

TEST(CommGroups, SplitByParityReducesWithinEachGroup) {
  run_ranks(7, [](Communicator& comm) {
    // Key reverses the order, so group rank 0 is the highest world rank of the color.
    Communicator half = comm.split(comm.rank() % 2, -comm.rank());
    const int color = comm.rank() % 2;
    const int expected_size = color == 0 ? 4 : 3;
    ASSERT_EQ(half.size(), expected_size);
    EXPECT_EQ(half.world_ranks().front(), color == 0 ? 6 : 5);
    float x = float(comm.rank());
    half.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(x, color == 0 ? 0 + 2 + 4 + 6 : 1 + 3 + 5);
    // The world group still works after the split.
    float y = 1;
    comm.all_reduce(&y, 1, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(y, 7);
  });
}

TEST(CommGroups, NewGroupOfASubsetInListOrder) {
  run_ranks(5, [](Communicator& comm) {
    auto group = comm.new_group({4, 1, 2});
    if (comm.rank() == 0 || comm.rank() == 3) {
      EXPECT_FALSE(group.has_value());
      return;
    }
    ASSERT_TRUE(group.has_value());
    EXPECT_EQ(group->size(), 3);
    EXPECT_EQ(group->world_ranks(), (std::vector<int>{4, 1, 2}));
    std::vector<float> v(3, -1);
    v[size_t(group->rank())] = float(comm.rank());
    group->all_gather(v.data() + group->rank(), v.data(), 1, DType::kF32);
    EXPECT_EQ(v, (std::vector<float>{4, 1, 2}));
  });
}

TEST(CommGroups, OverlappingGroupsRunConcurrently) {
  // A 2 x 3 mesh: rows and columns, each rank in one of each; all rows reduce at the same
  // time, then all columns; then nested groups of the rows.
  run_ranks(6, [](Communicator& comm) {
    Communicator row = comm.split(comm.rank() / 3, comm.rank());
    Communicator col = comm.split(comm.rank() % 3, comm.rank());
    float r = float(comm.rank()), c = float(comm.rank());
    row.all_reduce(&r, 1, DType::kF32, ReduceOp::kMax);
    col.all_reduce(&c, 1, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(r, comm.rank() < 3 ? 2 : 5);
    EXPECT_EQ(c, float(2 * (comm.rank() % 3) + 3));
    auto pair = row.new_group({0, 1});
    if (pair) {
      float p = 1;
      pair->all_reduce(&p, 1, DType::kF32, ReduceOp::kSum);
      EXPECT_EQ(p, 2);
      EXPECT_EQ(pair->name(), fmt::format("world/split{}/group[0, 1]", comm.rank() / 3));
    }
  });
}

TEST(CommGroups, RefusesBadRankLists) {
  run_ranks(2, [](Communicator& comm) {
    EXPECT_THROW(comm.new_group({0, 0}), ValueError);
    EXPECT_THROW(comm.new_group({0, 2}), ValueError);
    EXPECT_THROW(comm.new_group({}), ValueError);
  });
}

}  // namespace
}  // namespace lattice
