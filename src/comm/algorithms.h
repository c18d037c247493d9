// The building blocks every collective is composed of (collectives.cpp), each working in place
// on a buffer that holds the whole vector: n blocks, block v belonging to virtual rank v.
//
//   *_reduce_scatter: afterwards block v on rank v holds the reduction of everyone's block v
//                     (the other blocks hold partial sums).
//   *_all_gather:     block v valid on rank v beforehand; every block valid on every rank after.
//   tree_reduce:      rank 0 ends with the reduction of the whole buffer (others: partial sums).
//   tree_broadcast:   rank 0's buffer copied to all.
//   tree_gather/scatter: blocks to / from rank 0 along a binomial tree (subtrees hold
//                     contiguous blocks, so every message is one range).
//   ring_broadcast:   rank 0's buffer pushed along the chain 0 -> 1 -> ... in pipelined segments.
#pragma once

#include "comm/exchange.h"

namespace lattice {

void ring_reduce_scatter(Exchange& ex, void* buf, const Blocks& blocks);
void ring_all_gather(Exchange& ex, void* buf, const Blocks& blocks);
void ring_broadcast(Exchange& ex, void* buf, int64_t count);

void hd_reduce_scatter(Exchange& ex, void* buf, const Blocks& blocks);
void hd_all_gather(Exchange& ex, void* buf, const Blocks& blocks);

void tree_reduce(Exchange& ex, void* buf, int64_t count);
void tree_broadcast(Exchange& ex, void* buf, int64_t count);
void tree_gather(Exchange& ex, void* buf, const Blocks& blocks);
void tree_scatter(Exchange& ex, void* buf, const Blocks& blocks);

}  // namespace lattice
