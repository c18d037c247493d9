// The one validation point: counts, dtype, divisibility, roots, peers and aliasing are refused
// with typed errors before any rank communicates.
#include <gtest/gtest.h>

#include "comm/thread_world.h"

namespace lattice {
namespace {

TEST(CommValidation, RefusesBadCalls) {
  run_ranks(1, [](Communicator& comm) {
    std::vector<float> a(12), b(12);
    std::vector<int32_t> ints(4);
    EXPECT_THROW(comm.all_reduce(ints.data(), 4, DType::kI32, ReduceOp::kSum), DTypeError);
    EXPECT_THROW(comm.all_reduce(a.data(), -1, DType::kF32, ReduceOp::kSum), ShapeError);
    EXPECT_THROW(comm.all_reduce(nullptr, 3, DType::kF32, ReduceOp::kSum), ValueError);
    EXPECT_THROW(comm.broadcast(a.data(), 4, DType::kF32, 1), ValueError);
    EXPECT_THROW(comm.reduce(a.data(), b.data(), 4, DType::kF32, -1, ReduceOp::kSum), ValueError);
    EXPECT_THROW(comm.send(a.data(), 4, DType::kF32, 0), ValueError);  // to itself
    EXPECT_THROW(comm.reduce(a.data(), a.data() + 2, 4, DType::kF32, 0, ReduceOp::kSum),
                 ValueError);  // partial overlap
    CollectiveOptions native;
    native.algorithm = Algorithm::kNative;
    EXPECT_THROW(comm.all_reduce(a.data(), 4, DType::kF32, ReduceOp::kSum, native), ValueError);
    CollectiveOptions negative;
    negative.timeout = std::chrono::milliseconds(-1);
    EXPECT_THROW(comm.barrier(negative), ValueError);
    EXPECT_EQ(comm.sequence(), 0u);  // nothing refused reached the wire
  });
}

TEST(CommValidation, RefusesIndivisibleAndAliasedScatterGather) {
  run_ranks(3, [](Communicator& comm) {
    Arena arena("test");
    Tensor input = Tensor::empty(arena, {10}, DType::kF32);
    Tensor output = Tensor::empty(arena, {3}, DType::kF32);
    try {
      comm.reduce_scatter(input, output, ReduceOp::kSum);
      ADD_FAILURE() << "10 elements scattered over 3 ranks";
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("not divisible by the group size 3"), std::string::npos)
          << e.what();
    }
    std::vector<float> buf(12);
    EXPECT_THROW(comm.reduce_scatter(buf.data(), buf.data() + 8, 4, DType::kF32, ReduceOp::kSum),
                 ValueError);
    EXPECT_THROW(comm.all_gather(buf.data() + 1, buf.data(), 4, DType::kF32), ValueError);
    Tensor wrong = Tensor::empty(arena, {9}, DType::kBF16);
    Tensor in3 = Tensor::empty(arena, {3}, DType::kF32);
    EXPECT_THROW(comm.all_gather(in3, wrong), DTypeError);
    Tensor out8 = Tensor::empty(arena, {8}, DType::kF32);
    EXPECT_THROW(comm.all_gather(in3, out8), ShapeError);
    EXPECT_EQ(comm.sequence(), 0u);
  });
}

TEST(CommValidation, RefusesBadAllToAllCalls) {
  run_ranks(2, [](Communicator& comm) {
    std::vector<float> in(8), out(8);
    const std::vector<int64_t> two = {2, 2};
    EXPECT_THROW(comm.all_to_all(in.data(), {2, 2, 2}, out.data(), two, DType::kF32), ShapeError);
    EXPECT_THROW(comm.all_to_all(in.data(), {-1, 3}, out.data(), two, DType::kF32), ShapeError);
    // The block a rank keeps for itself has one length.
    const std::vector<int64_t> own =
        comm.rank() == 0 ? std::vector<int64_t>{3, 2} : std::vector<int64_t>{2, 3};
    EXPECT_THROW(comm.all_to_all(in.data(), own, out.data(), two, DType::kF32), ShapeError);
    EXPECT_THROW(comm.all_to_all(in.data(), two, in.data() + 2, two, DType::kF32), ValueError);
    CollectiveOptions ring;
    ring.algorithm = Algorithm::kRing;
    try {
      comm.all_to_all(in.data(), two, out.data(), two, DType::kF32, ring);
      ADD_FAILURE() << "all_to_all forced to ring";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("all_to_all runs 'pairwise'"), std::string::npos)
          << e.what();
    }
    CollectiveOptions pairwise;
    pairwise.algorithm = Algorithm::kPairwise;
    EXPECT_THROW(comm.all_reduce(in.data(), 4, DType::kF32, ReduceOp::kSum, pairwise), ValueError);
    EXPECT_EQ(comm.sequence(), 0u);
  });
}

}  // namespace
}  // namespace lattice
