// The periodic checkpoints of a running trainer (`lattice train`'s output.checkpoint_every),
// saved synchronously or asynchronously (--ckpt-async, output.checkpoint_async), on every rank
// of any dp × tp × pp layout.
//
//   TrainerCheckpointer checkpoints(root, trainer, mesh.world(), {.async = true});
//   for each step: trainer.train_step(); checkpoints.after_step();
//                  if due: checkpoints.save();
//   at the end:    checkpoints.finish();   // the last save committed, or its error thrown
//
// Every call is collective over `world` (every rank calls it at the same step) and runs on the
// training thread; asynchronous writes never touch a communicator (collective_async_saver.h).
// With slots_of_generation (elastic snapshots on one node, snapshot_slots.h) no call is
// collective: each save only writes this rank's slot.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include "ckpt/collective_async_saver.h"
#include "ckpt/shard_writer.h"
#include "ckpt/snapshot_slots.h"
#include "comm/communicator.h"
#include "train/trainer.h"

namespace lattice {

struct TrainerCheckpointOptions {
  CommitOptions commit = {};  // keep_last, timeouts, test hooks
  bool async = false;         // snapshot, then write on a background thread while training goes on
  // Elastic snapshots on one node (snapshot_slots.h): each save copies this rank's shard into
  // one of its two shared-memory slots under `root`, stamped with this generation, and nothing
  // is committed (after a failure the next generation commits the newest: commit_slot_snapshot).
  // commit.fence is checked before each slot is published.
  std::optional<int64_t> slots_of_generation = std::nullopt;
  // Slots: called while each slot is being written, its bytes in, not yet published.
  std::function<void()> while_slot_torn = {};
};

class TrainerCheckpointer {
 public:
  // `world`: every rank of the run (DeviceMesh::world()); ConfigError when its size is not the
  // trainer's dp × tp × pp. Asynchronous: allocates the snapshot buffers now (this rank's
  // owned shards: master weights and both moments of its range), so that no save's stall
  // includes faulting in fresh memory.
  TrainerCheckpointer(std::filesystem::path root, Trainer& trainer, Communicator& world,
                      TrainerCheckpointOptions options = {});

  // Saves <root>/step_<trainer.step()>. Synchronous: committed on return. Asynchronous: waits
  // for the previous save (rethrowing its error), snapshots, starts the write. Slots: this
  // rank's slot is complete on return (local, no collective). Returns the seconds this rank's
  // training stalled.
  double save();
  // After every step: an asynchronous save is committed as soon as every rank has written it.
  void after_step();
  // Local: blocks until this rank's part of an asynchronous save in flight is written.
  void wait_written() const;
  // Waits for an asynchronous save in flight and commits it; rethrows a save's error (the same
  // IoError on every rank). Call before the run's final checkpoint and at its end.
  void finish();

  // The newest step directory committed by this checkpointer.
  const std::optional<std::filesystem::path>& last_committed() const;
  bool async() const { return async_ != nullptr; }
  bool slots() const { return slots_ != nullptr; }

 private:
  std::filesystem::path root_;
  Trainer& trainer_;
  Communicator& world_;
  CommitOptions commit_;
  std::unique_ptr<CollectiveAsyncSaver> async_;
  std::unique_ptr<SnapshotSlotWriter> slots_;
  std::optional<std::filesystem::path> last_sync_;
  // Where c_attn's q|k|v columns are copied for a save: kept, so that each save reuses its pages.
  std::unique_ptr<Arena> scratch_ = std::make_unique<Arena>("ckpt-save");
};

}  // namespace lattice
