// A copy of a rank's shards in memory it owns: what an asynchronous save writes while training
// changes the tensors the shards came from. The buffers are kept and reused by the next
// snapshot while the shards keep their shapes (every save of a run), so a snapshot after the
// first is a plain copy into pages already faulted in.
#pragma once

#include <vector>

#include "ckpt/shard_writer.h"
#include "core/arena.h"

namespace lattice {

class ShardSnapshot {
 public:
  // Allocates (and touches) buffers for shards shaped like `shards`, so that even the first
  // take() is a plain copy.
  void reserve(const std::vector<OwnedShard>& shards);
  // Copies `shards` (names, boxes and values); afterwards the caller may change their tensors.
  void take(const std::vector<OwnedShard>& shards);
  const std::vector<OwnedShard>& shards() const { return shards_; }
  const Arena& arena() const { return arena_; }

 private:
  bool fits(const std::vector<OwnedShard>& shards) const;
  void allocate(const std::vector<OwnedShard>& shards);

  Arena arena_{"ckpt-snapshot"};
  std::vector<OwnedShard> shards_;
};

}  // namespace lattice
