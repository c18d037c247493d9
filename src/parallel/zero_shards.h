// ZeRO sharding of the flat parameter range over the dp group (Rajbhandari et al. 2020).
//
// Each dp rank owns one contiguous shard of the flat buffer [0, P): ceil(P / n) elements rounded
// up to 16 (64-byte aligned views), the last shards shorter or empty. The owner alone keeps the
// AdamW moments of its shard and updates it; afterwards every owner broadcasts its updated shard
// so all replicas hold the full parameters again (the all-gather of ZeRO-1/2, done as n
// broadcasts because the shards need not be the same size).
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "parallel/grad_buckets.h"

namespace lattice {

// Shard of dp rank `rank` of `n` over `total` elements.
FlatRange zero_shard(int64_t total, int n, int rank);

// flat: f32 (total); each rank's shard is authoritative on its owner. Leaves all of it on all.
void gather_shards(Communicator& dp, float* flat, int64_t total);

}  // namespace lattice
