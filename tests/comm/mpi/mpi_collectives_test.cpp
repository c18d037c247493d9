// The collective suite on the mpi transport: run under `mpirun -np 4 --oversubscribe` (CTest
// label `mpi`). Every rank runs every test; the exit code is non-zero if any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>

#include "collective_check.h"
#include "comm/communicator.h"
#include "comm/mpi_transport.h"

namespace lattice {
namespace {

std::shared_ptr<MpiTransport> g_transport;

constexpr Collective kCollectives[] = {Collective::kAllReduce, Collective::kReduceScatter,
                                       Collective::kAllGather, Collective::kBroadcast,
                                       Collective::kReduce};
constexpr Algorithm kAlgorithms[] = {Algorithm::kRing, Algorithm::kHalvingDoubling,
                                     Algorithm::kTree, Algorithm::kNative, Algorithm::kAuto};

TEST(MpiLaunch, EnvironmentAgreesWithMpi) {
  ASSERT_TRUE(g_transport->launch().has_value()) << "not started by mpirun";
  EXPECT_EQ(g_transport->launch()->launcher, "openmpi");
  EXPECT_EQ(g_transport->launch()->rank, g_transport->world_rank());
  EXPECT_EQ(g_transport->launch()->size, g_transport->world_size());
}

TEST(MpiCollectives, WorldEveryCollectiveAndAlgorithmBitwise) {
  Communicator world(g_transport);
  for (Collective c : kCollectives) {
    for (Algorithm a : kAlgorithms) {
      EXPECT_GT(testing::check_collective_bitwise(world, c, a), 0)
          << collective_name(c) << " " << algorithm_name(a);
    }
  }
  EXPECT_GT(testing::check_collective_bitwise(world, Collective::kAllToAll, Algorithm::kAuto), 0);
}

// Groups of sizes 1, 2 and 3 carved out of the world, each checked in full.
TEST(MpiCollectives, SubgroupsEveryCollectiveAndAlgorithmBitwise) {
  Communicator world(g_transport);
  const int n = world.size();
  std::vector<std::vector<int>> lists = {{0}, {n - 1, 0}, {}};
  for (int r = 0; r < std::min(n, 3); ++r) lists[2].push_back((r + 1) % n);
  for (const auto& ranks : lists) {
    auto group = world.new_group(ranks);
    if (!group) continue;
    for (Collective c : kCollectives) {
      for (Algorithm a : kAlgorithms) {
        EXPECT_GT(testing::check_collective_bitwise(*group, c, a), 0)
            << group->name() << " " << collective_name(c) << " " << algorithm_name(a);
      }
    }
    EXPECT_GT(testing::check_collective_bitwise(*group, Collective::kAllToAll, Algorithm::kAuto),
              0);
  }
  world.barrier();
}

TEST(MpiCollectives, SplitAndPointToPoint) {
  Communicator world(g_transport);
  Communicator half = world.split(world.rank() % 2, world.rank());
  float x = float(world.rank());
  half.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
  float expected = 0;
  for (int r = world.rank() % 2; r < world.size(); r += 2) expected += float(r);
  EXPECT_EQ(x, expected);
  if (world.size() >= 2) {
    CollectiveOptions options;
    options.tag = 42;
    std::vector<float> v(100, float(world.rank()));
    if (world.rank() == 0) {
      world.send(v.data(), 100, DType::kF32, 1, options);
    } else if (world.rank() == 1) {
      world.recv(v.data(), 100, DType::kF32, 0, options);
      EXPECT_EQ(v[99], 0.0f);
    }
  }
  world.barrier();
}

// Last: leaves cancelled messages behind on its own group.
TEST(MpiTimeout, RankSkippingACollectiveFailsEveryOtherRank) {
  Communicator world(g_transport);
  std::vector<int> all(size_t(world.size()));
  for (int r = 0; r < world.size(); ++r) all[size_t(r)] = r;
  auto group = world.new_group(all);
  ASSERT_TRUE(group.has_value());
  const int skipper = world.size() - 1;
  if (world.rank() != skipper) {
    std::vector<float> data(1000, 1.0f);
    CollectiveOptions options;
    options.timeout = std::chrono::milliseconds(500);
    options.algorithm = Algorithm::kRing;
    try {
      group->all_reduce(data.data(), 1000, DType::kF32, ReduceOp::kSum, options);
      ADD_FAILURE() << "completed an all_reduce that rank " << skipper << " skipped";
    } catch (const TimeoutError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("all_reduce on group 'world/group"), std::string::npos) << what;
      EXPECT_NE(what.find("sequence number 1"), std::string::npos) << what;
      EXPECT_NE(what.find("did not answer"), std::string::npos) << what;
    }
  }
  world.barrier();
}

}  // namespace
}  // namespace lattice

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  lattice::g_transport = lattice::MpiTransport::create();
  if (lattice::g_transport->world_rank() != 0) {
    // One rank reports progress; failures on any rank still print and fail the run.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed && lattice::g_transport->world_rank() == 0 && !failed) {
    std::fprintf(stderr, "another rank failed (see its output above)\n");
  }
  lattice::g_transport.reset();  // finalises MPI
  return any_failed;
}
