// The dp building blocks on real ranks: exact scalar sums, ZeRO shards and their gather, and the
// replica check (the bucketed reduction: tests/data_parallel/).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "comm/thread_world.h"
#include "core/arena.h"
#include "core/error.h"
#include "parallel/rank_sum.h"
#include "parallel/replica_check.h"
#include "parallel/zero_shards.h"

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

TEST(RankSum, IsExactInDoubleAndTheSameOnEveryRank) {
  run_ranks(3, [](Communicator& comm) {
    const double mine = 1.0 / 3.0 + comm.rank() * 1e-12;
    std::vector<double> sums = sum_over_ranks(comm, {mine, double(comm.rank())});
    const double expected = (1.0 / 3.0 + 0.0) + (1.0 / 3.0 + 1e-12) + (1.0 / 3.0 + 2e-12);
    EXPECT_EQ(sums[0], expected);
    EXPECT_EQ(sums[1], 3.0);
  });
}

TEST(ZeroShards, TileTheRangeAlignedTo16) {
  for (int64_t total : {0, 1, 17, 259, 1000}) {
    for (int n : {1, 2, 3, 4, 7}) {
      int64_t at = 0;
      for (int r = 0; r < n; ++r) {
        FlatRange s = zero_shard(total, n, r);
        EXPECT_EQ(s.begin, at) << total << " " << n << " " << r;
        EXPECT_EQ(s.begin % 16 == 0 || s.begin == total, true);
        EXPECT_LE(s.size(), ((total + n - 1) / n + 15) / 16 * 16);
        at = s.end;
      }
      EXPECT_EQ(at, total) << total << " " << n;
    }
  }
}

TEST(ZeroShards, GatherLeavesEveryOwnersShardOnAllRanks) {
  const int64_t P = 259;
  run_ranks(3, [&](Communicator& comm) {
    std::vector<float> flat(P, -1.0f);
    FlatRange mine = zero_shard(P, comm.size(), comm.rank());
    for (int64_t i = mine.begin; i < mine.end; ++i) flat[size_t(i)] = float(i);
    gather_shards(comm, flat.data(), P);
    for (int64_t i = 0; i < P; ++i) ASSERT_EQ(flat[size_t(i)], float(i)) << i;
  });
}

TEST(ReplicaCheck, PassesOnIdenticalReplicasAndNamesTheFirstThatDiffers) {
  const auto params = ranges_of({8, 8, 16});
  const std::vector<std::string> names{"a.weight", "b.weight", "c.bias"};
  run_ranks(3, [&](Communicator& comm) {
    Arena arena("r");
    Tensor master = Tensor::zeros(arena, {32}, DType::kF32, MemoryCategory::kParameters);
    for (int64_t i = 0; i < 32; ++i) master.data<float>()[i] = float(i) * 0.25f;
    EXPECT_EQ(check_replicas(comm, master, params, names), 3);
    // One bit of one element of b.weight on rank 2 (and c.bias on rank 1, later in flat order).
    if (comm.rank() == 2)
      master.data<float>()[11] = std::nextafter(master.data<float>()[11], 100.0f);
    if (comm.rank() == 1) master.data<float>()[20] = 0.0f;
    try {
      check_replicas(comm, master, params, names);
      ADD_FAILURE() << "replica check should fail on rank " << comm.rank();
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("'b.weight'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("dp rank 2"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace lattice
