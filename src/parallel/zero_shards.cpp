#include "parallel/zero_shards.h"

#include <algorithm>
#include <cstddef>

namespace lattice {

namespace {

FlatRange intersect(FlatRange a, FlatRange b) {
  const int64_t begin = std::max(a.begin, b.begin);
  return FlatRange{begin, std::max(begin, std::min(a.end, b.end))};
}

}  // namespace

FlatRange zero_shard(int64_t total, int n, int rank) {
  LATTICE_CHECK(n >= 1 && rank >= 0 && rank < n, "zero_shard: rank {} of {}", rank, n);
  const int64_t per_rank = ((total + n - 1) / n + 15) / 16 * 16;
  const int64_t begin = std::min(total, per_rank * rank);
  return FlatRange{begin, std::min(total, begin + per_rank)};
}

ZeroSharding zero_sharding(int stage, int dp, int dp_rank, int ep) {
  LATTICE_CHECK(ep >= 1 && dp % ep == 0, "zero_sharding: ep {} does not divide dp {}", ep, dp);
  return ZeroSharding{.stage = stage, .ranks = dp / ep, .rank = dp_rank / ep};
}

void gather_shards(Communicator& dp, float* flat, int64_t total) {
  broadcast_from_owners(dp, flat, FlatRange{0, total}, total);
}

void reduce_to_owners(Communicator& dp, float* data, FlatRange range, int64_t total,
                      const std::function<void(FlatRange piece, const float* sums)>& on_owned) {
  for (int r = 0; r < dp.size(); ++r) {
    const FlatRange piece = intersect(range, zero_shard(total, dp.size(), r));
    if (piece.size() == 0) continue;
    float* at = data + (piece.begin - range.begin);
    dp.reduce(at, at, piece.size(), DType::kF32, r, ReduceOp::kSum);
    if (r == dp.rank()) on_owned(piece, at);
  }
}

void broadcast_from_owners(Communicator& dp, float* data, FlatRange range, int64_t total) {
  broadcast_from_owners(dp, data, DType::kF32, range, total);
}

void broadcast_from_owners(Communicator& dp, void* data, DType dtype, FlatRange range,
                           int64_t total) {
  const size_t element = dtype_size(dtype);
  for (int r = 0; r < dp.size(); ++r) {
    const FlatRange piece = intersect(range, zero_shard(total, dp.size(), r));
    if (piece.size() == 0) continue;
    void* at = static_cast<std::byte*>(data) + size_t(piece.begin - range.begin) * element;
    dp.broadcast(at, piece.size(), dtype, r);
  }
}

}  // namespace lattice
