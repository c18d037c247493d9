// The in-memory snapshots of a job on several nodes (docs/elastic.md, "Several nodes"): each
// rank writes its shard into its own node's shared memory, and its write thread then sends the
// shard and its record to the rank of the same local index on the next node (in node order, a
// ring), which writes them into its node's copy; it receives the previous node's the same way.
// So every node's copy holds its own ranks' shards and the previous node's: with two nodes each
// node holds the whole snapshot; with more, the surviving copies together hold it unless two
// neighbouring nodes are lost, and the next generation fills each copy from the others before
// it restores (fill). The copies travel on a gloo world of their own (built beside the
// generation's world), used by the write thread alone while training, never by the training
// thread's collectives.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <vector>

#include "comm/communicator.h"
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

  // Collective over `world` (every rank calls it, before a generation restores): each node's
  // first rank lists what its copy under `root` holds, and fetches what it lacks from the first
  // node holding it (committed snapshots file by file, those only written shard by shard with
  // their records), so that every copy then holds what the surviving copies hold together. The
  // price: until newer snapshots replace them, each node holds the whole of those snapshots.
  void fill(const std::filesystem::path& root, Communicator& world) const;

  // The rank that keeps a copy of `rank`'s shard, and the ranks whose shards `rank` keeps.
  int target(int rank) const;
  std::vector<int> sources(int rank) const;
  // The ranks whose shards the copy of `rank`'s node holds once a save is replicated: the
  // node's own and those its ranks keep (CommitOptions::kept_ranks).
  std::vector<int> kept_with(int rank) const;
  const std::vector<int>& node_of_rank() const { return node_of_rank_; }

 private:
  std::shared_ptr<Transport> transport_;
  std::vector<int> node_of_rank_;
  std::chrono::milliseconds timeout_;
};

}  // namespace lattice
