// Asynchronous checkpoint saves (--ckpt-async): save() copies the shards into memory the saver
// owns (the only stall training sees; the buffers are kept and reused by the next save), then a
// background thread writes and commits them by the usual protocol while training continues.
//
// At most one save is in flight: save() first waits for the previous one. A write error is
// kept and rethrown by the next save() or wait(), and nothing of that save is committed (the
// commit is the protocol's last step; the staging directory is removed). Across ranks the
// caller turns that error into a collective one (every rank must learn of it): see
// CollectiveAsyncSaver (collective_async_saver.h) for the saver of a multi-rank run.
#pragma once

#include <cstdint>
#include <filesystem>
#include <future>
#include <vector>

#include "ckpt/shard_snapshot.h"
#include "ckpt/shard_writer.h"

namespace lattice {

class AsyncCheckpointSaver {
 public:
  explicit AsyncCheckpointSaver(std::filesystem::path root, CommitOptions options = {});
  // Waits for a save in flight; an error it ends with is logged (destructors do not throw).
  ~AsyncCheckpointSaver();
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;

  // Waits for the previous save (rethrowing its error), snapshots `shards`, and starts writing
  // <root>/step_<manifest.step> on the background thread. On return the caller may change the
  // tensors the shards refer to.
  void save(Manifest manifest, const std::vector<OwnedShard>& shards);
  // Allocates (and touches) the snapshot buffers for shards shaped like `shards` ahead of the
  // first save, so that save's stall is a plain copy too. Optional.
  void reserve(const std::vector<OwnedShard>& shards);
  // Blocks until no save is in flight; rethrows the error of the save that just finished.
  void wait();
  // True from save() until wait() (or the next save) has collected its outcome.
  bool in_flight() const { return pending_.valid(); }
  // Snapshot memory (kept between saves and reused while the shapes stay the same).
  const Arena& snapshot_arena() const { return snapshot_.arena(); }

 private:
  CheckpointRoot root_;
  CommitOptions options_;
  ShardSnapshot snapshot_;
  std::future<void> pending_;
};

}  // namespace lattice
