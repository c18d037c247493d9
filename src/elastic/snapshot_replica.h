// The in-memory snapshots of a job on several nodes (docs/elastic.md, "Several nodes"): each
// rank writes its shard into its own node's shared memory, and its write thread then sends the
// shard and its record to the rank of the same local index on the next node (in node order, a
// ring), which writes them into its node's copy; it receives the previous node's the same way.
// So every node's copy holds its own ranks' shards and the previous node's: with two nodes each
// node holds the whole snapshot, and losing one loses no state. The copies travel on a gloo
// world of their own (built beside the generation's world), used by the write thread alone,
// never by the training thread's collectives.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <vector>

#include "comm/transport.h"

namespace lattice {

class SnapshotReplicator {
 public:
  // `node_of_rank`: the node of every world rank (the same on every rank).
  SnapshotReplicator(std::shared_ptr<Transport> transport, std::vector<int> node_of_rank,
                     std::chrono::milliseconds timeout);

  // CommitOptions::replicate: sends this rank's shard and record in `staging` to target(), and
  // writes those of sources() into `staging`. CommError when a peer is lost meanwhile.
  void replicate(const std::filesystem::path& staging, int rank) const;

  // The rank that keeps a copy of `rank`'s shard, and the ranks whose shards `rank` keeps.
  int target(int rank) const;
  std::vector<int> sources(int rank) const;
  const std::vector<int>& node_of_rank() const { return node_of_rank_; }

 private:
  std::shared_ptr<Transport> transport_;
  std::vector<int> node_of_rank_;
  std::chrono::milliseconds timeout_;
};

}  // namespace lattice
