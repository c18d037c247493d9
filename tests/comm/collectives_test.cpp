// Every collective x algorithm x group size 1..8 x counts {0, 1, not divisible by the group,
// large} x dtype (f32, bf16) x op, on the threads transport, compared bit for bit against a
// reference computed from the verifiable inputs.
#include <gtest/gtest.h>

#include <atomic>
#include <tuple>

#include "collective_check.h"
#include "comm/thread_world.h"

namespace lattice {
namespace {

using Param = std::tuple<Collective, Algorithm, int>;

class CollectiveTest : public ::testing::TestWithParam<Param> {};

TEST_P(CollectiveTest, MatchesReferenceBitwise) {
  // Not a structured binding: clang 14 cannot capture one in the lambda below.
  const Collective collective = std::get<0>(GetParam());
  const Algorithm algorithm = std::get<1>(GetParam());
  const int n = std::get<2>(GetParam());
  std::atomic<int> checks{0};
  run_ranks(n, [&](Communicator& comm) {
    checks += testing::check_collective_bitwise(comm, collective, algorithm);
  });
  EXPECT_GT(checks.load(), 0);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [c, a, n] = info.param;
  return std::string(collective_name(c)) + "_" + std::string(algorithm_name(a)) + "_n" +
         std::to_string(n);
}

INSTANTIATE_TEST_SUITE_P(
    AllCollectives, CollectiveTest,
    ::testing::Combine(::testing::Values(Collective::kAllReduce, Collective::kReduceScatter,
                                         Collective::kAllGather, Collective::kBroadcast,
                                         Collective::kReduce),
                       ::testing::Values(Algorithm::kRing, Algorithm::kHalvingDoubling,
                                         Algorithm::kTree, Algorithm::kAuto),
                       ::testing::Range(1, 9)),
    param_name);

INSTANTIATE_TEST_SUITE_P(AllToAll, CollectiveTest,
                         ::testing::Combine(::testing::Values(Collective::kAllToAll),
                                            ::testing::Values(Algorithm::kPairwise,
                                                              Algorithm::kAuto),
                                            ::testing::Range(1, 9)),
                         param_name);

// A rank that expects another length from a peer than the peer sends fails at once with an
// error naming both ranks, instead of reading a wrong block.
TEST(CollectiveAllToAll, MismatchedCountsNameBothRanks) {
  std::atomic<int> errors{0};
  run_ranks(2, [&](Communicator& comm) {
    std::vector<float> input(8, 1.0f), output(8);
    // Rank 0 sends rank 1 three elements; rank 1 expects four.
    const std::vector<int64_t> send =
        comm.rank() == 0 ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{4, 2};
    const std::vector<int64_t> recv =
        comm.rank() == 0 ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{4, 2};
    CollectiveOptions options;
    options.timeout = std::chrono::milliseconds(3000);
    try {
      comm.all_to_all(input.data(), send, output.data(), recv, DType::kF32, options);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("rank 0 sent 12 bytes where rank 1 expected 16") != std::string::npos) ++errors;
    }
  });
  EXPECT_EQ(errors.load(), 1);
}

// The statistics count the bytes this rank sends, its own block included (nccl-tests' size).
TEST(CollectiveAllToAll, StatisticsCountTheBytesSent) {
  run_ranks(3, [](Communicator& comm) {
    const std::vector<int64_t> counts(3, int64_t(comm.rank()) + 1);
    std::vector<float> input(size_t(3 * (comm.rank() + 1)), float(comm.rank()));
    std::vector<float> output(6);
    comm.all_to_all(input.data(), counts, output.data(), {1, 2, 3}, DType::kF32);
    const CollectiveTotals t = comm.stats().totals(Collective::kAllToAll);
    EXPECT_EQ(t.calls, 1u);
    EXPECT_EQ(t.bytes, uint64_t(input.size() * sizeof(float)));
    EXPECT_EQ(output, (std::vector<float>{0, 1, 1, 2, 2, 2}));
  });
}

// bf16 sums accumulate in fp32: 256 + 1 + 1 - 2 is 256, but rounding each partial sum to bf16
// (257 -> 256) would give 254 for some orders of accumulation.
TEST(CollectiveBf16, SumAccumulatesInFp32) {
  for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree}) {
    run_ranks(4, [&](Communicator& comm) {
      const float mine[] = {256.0f, 1.0f, 1.0f, -2.0f};
      std::vector<bf16> data(64, bf16(mine[comm.rank()]));
      CollectiveOptions options;
      options.algorithm = a;
      comm.all_reduce(data.data(), int64_t(data.size()), DType::kBF16, ReduceOp::kSum, options);
      for (bf16 v : data) EXPECT_EQ(float(v), 256.0f) << algorithm_name(a);
    });
  }
}

TEST(CollectiveTensor, AllReduceAndAllGatherOnTensors) {
  run_ranks(3, [](Communicator& comm) {
    Arena arena("test");
    Tensor grad = Tensor::empty(arena, {2, 5}, DType::kF32);
    for (int64_t i = 0; i < 10; ++i) grad.data<float>()[i] = float(comm.rank() * 10 + i);
    comm.all_reduce(grad, ReduceOp::kSum);
    for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(grad.data<float>()[i], float(30 + 3 * i));

    Tensor shard = Tensor::empty(arena, {4}, DType::kBF16);
    for (int64_t i = 0; i < 4; ++i) shard.data<bf16>()[i] = bf16(float(comm.rank() * 4 + i));
    Tensor full = Tensor::empty(arena, {3, 4}, DType::kBF16);
    comm.all_gather(shard, full);
    for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(float(full.data<bf16>()[i]), float(i));
  });
}

TEST(CollectiveInPlace, AllGatherFromOwnBlockOfOutput) {
  run_ranks(4, [](Communicator& comm) {
    std::vector<float> out(8, -1.0f);
    out[size_t(2 * comm.rank())] = float(2 * comm.rank());
    out[size_t(2 * comm.rank() + 1)] = float(2 * comm.rank() + 1);
    comm.all_gather(out.data() + 2 * comm.rank(), out.data(), 2, DType::kF32);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(out[size_t(i)], float(i));
  });
}

TEST(CollectiveBarrier, NobodyLeavesBeforeEveryoneArrived) {
  for (int n : {1, 2, 5, 8}) {
    std::atomic<int> arrived{0};
    run_ranks(n, [&](Communicator& comm) {
      ++arrived;
      comm.barrier();
      EXPECT_EQ(arrived.load(), n);
      comm.barrier();  // keeps the counter stable until everyone checked it
    });
  }
}

}  // namespace
}  // namespace lattice
