#include "parallel/zero_shards.h"

#include <algorithm>

namespace lattice {

FlatRange zero_shard(int64_t total, int n, int rank) {
  LATTICE_CHECK(n >= 1 && rank >= 0 && rank < n, "zero_shard: rank {} of {}", rank, n);
  const int64_t per_rank = ((total + n - 1) / n + 15) / 16 * 16;
  const int64_t begin = std::min(total, per_rank * rank);
  return FlatRange{begin, std::min(total, begin + per_rank)};
}

void gather_shards(Communicator& dp, float* flat, int64_t total) {
  const CollectiveOptions options{.algorithm = Algorithm::kRing};
  for (int r = 0; r < dp.size(); ++r) {
    const FlatRange shard = zero_shard(total, dp.size(), r);
    if (shard.size() == 0) continue;
    dp.broadcast(flat + shard.begin, shard.size(), DType::kF32, r, options);
  }
}

}  // namespace lattice
