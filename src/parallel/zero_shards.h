// ZeRO sharding of the flat parameter range over the dp group (Rajbhandari et al. 2020).
//
// Each dp rank owns one contiguous shard of the flat buffer [0, P): ceil(P / n) elements rounded
// up to 16 (64-byte aligned views), the last shards shorter or empty. What the owner alone keeps
// grows with the stage:
//   1: the AdamW moments of its shard (it alone updates the shard, then broadcasts it);
//   2: also the reduced gradients of its shard: each gradient bucket is reduced to the owners of
//      its elements (reduce_to_owners), and the bucket buffer is freed;
//   3: also the f32 master weights of its shard: a layer's parameters are gathered from their
//      owners (broadcast_from_owners) just before it runs, and freed after.
// Any range of the flat buffer meets at most a few shards, so the per-range collectives below are
// one reduce or broadcast per owner the range meets: a reduce-scatter (or all-gather) whose pieces
// need not be equal.
#pragma once

#include <cstdint>
#include <functional>

#include "comm/communicator.h"
#include "parallel/grad_buckets.h"

namespace lattice {

// Shard of dp rank `rank` of `n` over `total` elements.
FlatRange zero_shard(int64_t total, int n, int rank);

// A rank's ZeRO stage and place in its dp group.
struct ZeroSharding {
  int stage = 0;
  int ranks = 1;  // dp group size
  int rank = 0;
  bool shards_optimizer() const { return stage >= 1 && ranks > 1; }
  bool shards_gradients() const { return stage >= 2 && ranks > 1; }
  bool shards_parameters() const { return stage >= 3 && ranks > 1; }
  // The elements of a flat buffer of `total` this rank owns ([0, total) when nothing is sharded).
  FlatRange owned(int64_t total) const {
    return shards_optimizer() ? zero_shard(total, ranks, rank) : FlatRange{0, total};
  }
};

// The sharding of a dp rank's store. Under expert parallelism (ep > 1) the ep consecutive dp
// ranks hold different experts in the same places of their stores, so an element is the same
// parameter only on the dp / ep ranks holding the same experts: ZeRO shards over those (dense
// parameters included, which each such group updates identically from the same reduced
// gradients), rank dp_rank / ep of them. ep = dp leaves nothing to shard.
ZeroSharding zero_sharding(int stage, int dp, int dp_rank, int ep = 1);

// flat: f32 (total); each rank's shard is authoritative on its owner. Leaves all of it on all.
void gather_shards(Communicator& dp, float* flat, int64_t total);

// For each owner r whose shard meets `range` (of a flat buffer of `total` elements), in rank
// order: the piece [range ∩ shard r) is summed over the group into that rank's `data` (the
// buffer holding `range`: data[0] is element range.begin), and `on_owned(piece, sums)` runs on
// the owner with the summed piece. The other ranks' pieces are left unspecified. Ring reduction
// (fixed order: bitwise repeatable).
void reduce_to_owners(Communicator& dp, float* data, FlatRange range, int64_t total,
                      const std::function<void(FlatRange piece, const float* sums)>& on_owned);

// For each owner r whose shard meets `range`, in rank order: the owner's piece of `data` (as
// above) is broadcast to every rank. Before the call each rank must hold its own piece.
void broadcast_from_owners(Communicator& dp, float* data, FlatRange range, int64_t total);
// The same for a buffer of any dtype (the bf16 compute copy under ZeRO-1/2).
void broadcast_from_owners(Communicator& dp, void* data, DType dtype, FlatRange range,
                           int64_t total);

}  // namespace lattice
