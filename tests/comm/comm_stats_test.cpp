#include "comm/comm_stats.h"

#include <gtest/gtest.h>

#include "comm/thread_world.h"

namespace lattice {
namespace {

TEST(CommStats, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::kReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::kAllGather, 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::kBroadcast, 8), 1.0);
}

TEST(CommStats, CountsCallsAndBytesPerCollectiveAndAlgorithm) {
  run_ranks(4, [](Communicator& comm) {
    std::vector<float> a(64), b(16);
    CollectiveOptions ring;
    ring.algorithm = Algorithm::kRing;
    comm.all_reduce(a.data(), 64, DType::kF32, ReduceOp::kSum, ring);
    comm.all_reduce(a.data(), 32, DType::kF32, ReduceOp::kSum, ring);
    comm.reduce_scatter(a.data(), b.data(), 16, DType::kF32, ReduceOp::kSum, ring);
    const auto& t = comm.stats().totals(Collective::kAllReduce, Algorithm::kRing);
    EXPECT_EQ(t.calls, 2u);
    EXPECT_EQ(t.bytes, 96u * 4);
    EXPECT_GT(t.seconds, 0);
    EXPECT_DOUBLE_EQ(comm.stats().busbw(Collective::kAllReduce), t.algbw() * 1.5);
    EXPECT_EQ(comm.stats().totals(Collective::kReduceScatter).bytes, 64u * 4);  // full input
    EXPECT_EQ(comm.stats().totals(Collective::kBroadcast).calls, 0u);
    EXPECT_NE(comm.stats().report().find("reduce_scatter"), std::string::npos);
  });
}

}  // namespace
}  // namespace lattice
