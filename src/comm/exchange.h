// One collective call as the algorithms see it: the n ranks of a group renumbered so that the
// call's root is virtual rank 0, moving ranges of typed elements under one deadline.
//
// Message tags: bit 63 marks collective traffic, bits 40..62 the user's tag, bits 16..39 the
// call's sequence number, bits 12..15 the phase (a collective may chain two algorithms), bits
// 0..11 the step inside the phase. Both sides of every message compute the same tag.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/transport.h"

namespace lattice {

// Element offsets of the n blocks a vector is cut into, indexed by virtual rank: block v is
// [begin[v], begin[v + 1]). Blocks may be empty or of unequal length.
struct Blocks {
  std::vector<int64_t> begin;
  int64_t start(int v) const { return begin[size_t(v)]; }
  int64_t end(int v) const { return begin[size_t(v) + 1]; }
  int64_t total() const { return begin.back(); }
  // n blocks of `per_rank` elements each (reduce_scatter, all_gather).
  static Blocks uniform(int n, int64_t per_rank);
  // `count` elements cut as evenly as possible into n blocks (all_reduce, broadcast).
  static Blocks balanced(int n, int64_t count);
};

class Exchange {
 public:
  Exchange(Transport& transport, const std::vector<int>& members, int group_rank, int root,
           uint64_t context, uint64_t tag_base, Deadline deadline, DType dtype, ReduceOp op);

  int size() const { return int(members_.size()); }
  int vrank() const { return vrank_; }
  DType dtype() const { return dtype_; }
  size_t element_size() const { return element_size_; }
  Deadline deadline() const { return deadline_; }

  // Elements [begin, end) of `base`, to or from virtual rank `vpeer`, at `step` of this phase.
  PendingSendPtr send(int vpeer, int step, const void* base, int64_t begin, int64_t end);
  void recv(int vpeer, int step, void* base, int64_t begin, int64_t end);
  void recv_reduce(int vpeer, int step, void* base, int64_t begin, int64_t end);
  // Starts a new phase: its steps get tags distinct from the previous phase's.
  void next_phase() { ++phase_; }

 private:
  int world_rank_of(int vpeer) const;
  MessageKey key(int step) const;

  Transport& transport_;
  const std::vector<int>& members_;
  int vrank_;
  int root_;
  uint64_t context_;
  uint64_t tag_base_;
  Deadline deadline_;
  DType dtype_;
  ReduceOp op_;
  size_t element_size_;
  int phase_ = 0;
};

// Builds the tag_base for a collective call (see the layout above).
uint64_t collective_tag_base(uint32_t user_tag, uint64_t seq);

}  // namespace lattice
