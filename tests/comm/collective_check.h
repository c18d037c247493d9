// The bitwise check of one collective with one algorithm on a Communicator, over counts
// {0, 1, not divisible by the group, large} x dtype (f32, bf16) x op; shared by the threads
// suite (collectives_test.cpp) and the MPI suite (mpi/mpi_collectives_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>

#include "comm/communicator.h"
#include "comm_test_data.h"

namespace lattice::testing {

inline constexpr int64_t kLargeCount = int64_t(1) << 16;

inline float combine(float a, float b, ReduceOp op) {
  return op == ReduceOp::kSum ? a + b : std::max(a, b);
}

// Reference reduction of everyone's contribution at [begin, begin + count).
inline std::vector<float> reduced(int n, int64_t begin, int64_t count, ReduceOp op) {
  std::vector<float> out = contributions(0, begin, count);
  for (int r = 1; r < n; ++r) {
    for (int64_t i = 0; i < count; ++i) {
      out[size_t(i)] = combine(out[size_t(i)], contribution(r, begin + i), op);
    }
  }
  return out;
}

// Counts: totals for all_reduce / broadcast / reduce, per-rank for reduce_scatter / all_gather.
inline std::vector<int64_t> test_counts(int n, bool per_rank) {
  if (per_rank) return {0, 1, 3, kLargeCount / n + 1};
  return {0, 1, 2 * n + 1, kLargeCount + 3};
}

// all_to_all: elements rank `from` sends rank `to`, uneven and sometimes zero; `scale` sets the
// size (0: mostly empty blocks).
inline int64_t all_to_all_count(int from, int to, int64_t scale) {
  return (from * 3 + to * 5) % 4 * scale + (from + to) % 2;
}

// all_to_all over every dtype and three sizes: block j of rank i's input is contributions(i,
// j·kLargeCount, count(i, j)); rank r must receive exactly rank i's block r from each rank i.
inline int check_all_to_all_bitwise(Communicator& comm, Algorithm algorithm) {
  const int n = comm.size(), r = comm.rank();
  CollectiveOptions options;
  options.algorithm = algorithm;
  options.timeout = std::chrono::milliseconds(20000);
  int checks = 0;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t scale : {int64_t(0), int64_t(1), kLargeCount / n}) {
      std::vector<int64_t> send_counts, recv_counts;
      std::vector<float> input, expected;
      for (int j = 0; j < n; ++j) {
        send_counts.push_back(all_to_all_count(r, j, scale));
        recv_counts.push_back(all_to_all_count(j, r, scale));
        auto mine = contributions(r, j * kLargeCount, send_counts.back());
        input.insert(input.end(), mine.begin(), mine.end());
        auto theirs = contributions(j, r * kLargeCount, recv_counts.back());
        expected.insert(expected.end(), theirs.begin(), theirs.end());
      }
      auto in = encode(input, dtype);
      auto got = encode(std::vector<float>(expected.size(), -99.0f), dtype);
      comm.all_to_all(in.data(), send_counts, got.data(), recv_counts, dtype, options);
      EXPECT_EQ(first_mismatch(got, encode(expected, dtype), dtype), -1)
          << "all_to_all " << algorithm_name(algorithm) << " n=" << n << " rank=" << r
          << " scale=" << scale << " " << dtype_name(dtype);
      ++checks;
    }
  }
  return checks;
}

// Runs every case on this rank (all ranks of `comm` call it alike); returns the cases checked.
inline int check_collective_bitwise(Communicator& comm, Collective collective,
                                    Algorithm algorithm) {
  if (collective == Collective::kAllToAll) return check_all_to_all_bitwise(comm, algorithm);
  const int n = comm.size(), r = comm.rank();
  const bool per_rank =
      collective == Collective::kReduceScatter || collective == Collective::kAllGather;
  const bool reduces = collective != Collective::kAllGather && collective != Collective::kBroadcast;
  int checks = 0;
  CollectiveOptions options;
  options.algorithm = algorithm;
  options.timeout = std::chrono::milliseconds(20000);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      if (!reduces && op == ReduceOp::kMax) continue;
      for (int64_t count : test_counts(n, per_rank)) {
        const int root = int(count % n);
        std::vector<std::byte> got, want;
        switch (collective) {
          case Collective::kAllReduce:
            got = encode(contributions(r, 0, count), dtype);
            comm.all_reduce(got.data(), count, dtype, op, options);
            want = encode(reduced(n, 0, count, op), dtype);
            break;
          case Collective::kReduceScatter: {
            auto input = encode(contributions(r, 0, count * n), dtype);
            got = encode(std::vector<float>(size_t(count), -99.0f), dtype);
            comm.reduce_scatter(input.data(), got.data(), count, dtype, op, options);
            want = encode(reduced(n, count * r, count, op), dtype);
            break;
          }
          case Collective::kAllGather: {
            auto input = encode(contributions(r, count * r, count), dtype);
            got = encode(std::vector<float>(size_t(count * n), -99.0f), dtype);
            comm.all_gather(input.data(), got.data(), count, dtype, options);
            std::vector<float> expected;
            for (int q = 0; q < n; ++q) {
              auto part = contributions(q, count * q, count);
              expected.insert(expected.end(), part.begin(), part.end());
            }
            want = encode(expected, dtype);
            break;
          }
          case Collective::kBroadcast:
            got = encode(contributions(r, 0, count), dtype);
            comm.broadcast(got.data(), count, dtype, root, options);
            want = encode(contributions(root, 0, count), dtype);
            break;
          case Collective::kReduce: {
            auto input = encode(contributions(r, 0, count), dtype);
            got = encode(std::vector<float>(size_t(count), -99.0f), dtype);
            comm.reduce(input.data(), got.data(), count, dtype, root, op, options);
            want = r == root ? encode(reduced(n, 0, count, op), dtype)
                             : encode(std::vector<float>(size_t(count), -99.0f), dtype);
            break;
          }
          default:
            ADD_FAILURE() << "not a collective";
            return checks;
        }
        EXPECT_EQ(first_mismatch(got, want, dtype), -1)
            << collective_name(collective) << " " << algorithm_name(algorithm) << " n=" << n
            << " rank=" << r << " count=" << count << " " << dtype_name(dtype) << " "
            << reduce_op_name(op) << " root=" << root;
        ++checks;
      }
    }
  }
  return checks;
}

}  // namespace lattice::testing
