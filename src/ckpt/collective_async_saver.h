// Asynchronous checkpoint saves of a multi-rank run (--ckpt-async under any dp × tp × pp
// layout): every rank snapshots the shards it owns (the only stall), a background thread per
// rank writes its file, and the commit is collective: world rank 0 commits only after every
// rank's write succeeded.
//
// A Communicator is used by one thread at a time, and the training thread is using `world` (or
// groups split from it) all along, so the background threads never touch a communicator: they
// only write. Every collective step runs on the training thread, at points every rank reaches
// in the same order:
//
//   save()  (every rank, same step)  finish the previous save (as wait()); world rank 0 prepares
//                                    step_N.tmp, its outcome to every rank; snapshot; start the
//                                    write on the background thread
//   poll()  (every rank, e.g. after   one small all-reduce "has every rank finished writing?";
//            each step)               if so, the commit below, without waiting for anyone
//   wait()  (every rank)              block until this rank's write is done, then the commit:
//                                    every rank's outcome to every rank; world rank 0 commits
//                                    (manifest last, rename, `latest`, pruning), outcome to all
//
// At most one save is in flight. A failed write on any rank (or a failed commit) reaches every
// rank as the same IoError naming the rank and why, rethrown by the next save() or wait() (a
// poll() that completes a failed save keeps the error for them), and nothing is committed: the
// staging directory is removed, `latest` still names the previous checkpoint.
#pragma once

#include <exception>
#include <filesystem>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/shard_snapshot.h"
#include "ckpt/shard_writer.h"
#include "comm/communicator.h"

namespace lattice {

// Elastic snapshots (CommitOptions::record_writes): the newest save under `root`, newer than its
// newest committed step, that every rank of the world that saved it finished writing but that
// was never committed (that world lost a rank first), committed now by the one rank of the new
// world that calls this. Returns its directory; nullopt when there is none, or when a rank's
// record is missing (it died while writing: that torn copy is never restored, and readers fall
// back to the newest committed step).
std::optional<std::filesystem::path> commit_written_staging(const std::filesystem::path& root,
                                                            const CommitOptions& options = {});

// The step a next generation restores from `root`: the newest committed one, or a newer one
// every rank recorded writing (commit_written_staging commits it first) or holds complete in
// its snapshot slots (commit_slot_snapshot). Reads only.
std::optional<int64_t> newest_restorable_step(const std::filesystem::path& root);

// The record rank `rank` leaves in a staging directory once its shard file is written.
std::filesystem::path write_record_path(const std::filesystem::path& staging, int rank);

// Removes every staging directory under `root` (what a failed world left half written), after
// commit_written_staging took what it could: saves with CommitOptions::write_at_save do not
// clear their staging directory themselves.
void remove_staging(const std::filesystem::path& root);

class CollectiveAsyncSaver {
 public:
  // `world`: every rank of the run (DeviceMesh::world()); used only from the thread calling
  // save / poll / wait, and it must outlive the saver.
  CollectiveAsyncSaver(std::filesystem::path root, Communicator& world, CommitOptions options = {});
  // Joins this rank's write. It cannot commit (that is collective): a save still in flight is
  // abandoned uncommitted, with a warning; call wait() first.
  ~CollectiveAsyncSaver();
  CollectiveAsyncSaver(const CollectiveAsyncSaver&) = delete;
  CollectiveAsyncSaver& operator=(const CollectiveAsyncSaver&) = delete;

  // Allocates the snapshot buffers ahead of the first save (local, not collective).
  void reserve(const std::vector<OwnedShard>& shards) { snapshot_.reserve(shards); }
  // Collective. Finishes the previous save (rethrowing its error), then starts saving
  // <root>/step_<manifest.step>: `shards` are what this rank owns. On return the caller may change
  // the tensors the shards refer to. Every rank passes the same manifest header.
  void save(Manifest manifest, const std::vector<OwnedShard>& shards);
  // Collective and cheap: commits the save in flight if every rank has finished writing it.
  // Returns true when this call completed a save (committed or failed: see wait()).
  bool poll();
  // Collective: blocks until the save in flight is written on every rank and committed;
  // rethrows the error of a save that failed (also one that poll() completed).
  void wait();

  // Local: blocks until this rank's write of the save in flight is done (commits nothing). With
  // CommitOptions::record_writes the write is then recorded for a next generation to commit.
  void wait_written() const {
    if (pending_.valid()) pending_.wait();
  }

  bool in_flight() const { return pending_.valid(); }
  // The directory of the newest save this saver committed.
  const std::optional<std::filesystem::path>& last_committed() const { return last_committed_; }
  const Arena& snapshot_arena() const { return snapshot_.arena(); }

 private:
  // This rank's write: the result as JSON text, or why it failed.
  struct WriteOutcome {
    std::string result;
    std::string error;
  };
  // The collective end of the save in flight; its error, if any, is kept in error_.
  void finish();
  void rethrow_kept_error();
  // The rank that prepares and commits this rank's root: rank 0, or its node's first.
  bool leads_its_root() const;

  CheckpointRoot root_;
  Communicator& world_;
  CommitOptions options_;
  ShardSnapshot snapshot_;
  std::optional<Manifest> manifest_;  // of the save in flight
  std::future<WriteOutcome> pending_;
  std::exception_ptr error_;
  std::optional<std::filesystem::path> last_committed_;
};

}  // namespace lattice
