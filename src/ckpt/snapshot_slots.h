// Elastic snapshots on one node without a file, a manifest or a commit per step
// (docs/elastic.md, "Snapshots"). Each rank owns two slots in the agent's shared memory,
// <root>/slots/rank_NNNNN.slot0 and .slot1, each a file mapped once and kept, and writes every
// snapshot of its shard into the slot that does not hold its newest one:
//
//   state := writing → the shard file's bytes (the safetensors a checkpoint would hold, its
//   CRC32C computed while copying) and the record (manifest header, write result) → the
//   slot's generation, step and sizes → fence (a replaced generation publishes nothing) →
//   state := complete
//
// A rank killed while writing leaves that slot `writing`: never restored. Its other slot still
// holds its snapshot before. Every step has a collective over the whole world, so no rank
// completes snapshot N + 1 before every other has completed snapshot N: the newest step that
// every rank of the world completed is always in their slots.
//
// Only when a world fails does the next generation's lead turn that step into a checkpoint,
// step_N under <root> (commit_slot_snapshot), which resume_auto and the loader read like any
// other, resharding it when the world changed. The slots of the old world are then removed.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "ckpt/manifest.h"
#include "ckpt/shard_writer.h"

namespace lattice {

// A step every rank of a world holds complete in a slot.
struct SlotSnapshot {
  int64_t generation = 0;
  int64_t step = 0;
  int world = 0;  // ranks, each with one slot of this step
};

// One rank's writer of its two slots.
class SnapshotSlotWriter {
 public:
  // `generation` stamps every slot written; `fence` is called before a slot is marked complete
  // (a throw leaves it unpublished); `while_torn` once the slot is marked being written and
  // holds the shard's bytes, not yet published (where an injected snapshot fault lands).
  SnapshotSlotWriter(std::filesystem::path root, int rank, int64_t generation,
                     std::function<void()> fence = {}, std::function<void()> while_torn = {});
  ~SnapshotSlotWriter();
  SnapshotSlotWriter(const SnapshotSlotWriter&) = delete;
  SnapshotSlotWriter& operator=(const SnapshotSlotWriter&) = delete;

  // Sizes both slots for shards like these (their pages allocated and touched now, so that no
  // write pays for fresh memory). IoError naming the directory when shared memory is full.
  void reserve(const Manifest& manifest, const std::vector<OwnedShard>& shards);
  // Writes `shards` as this rank's part of snapshot `manifest.step` (manifest: the header every
  // rank passes) into the older slot. On return it is complete.
  void write(const Manifest& manifest, const std::vector<OwnedShard>& shards);

  // The slot files, for tests: <root>/slots/rank_NNNNN.slotK.
  std::filesystem::path slot_path(int slot) const;

 private:
  struct Mapping {
    int fd = -1;
    std::byte* base = nullptr;
    size_t size = 0;
  };
  // Maps slot `slot` with at least `bytes` bytes (growing it).
  Mapping& map(int slot, size_t bytes);

  std::filesystem::path dir_;
  int rank_;
  int64_t generation_;
  std::function<void()> fence_;
  std::function<void()> while_torn_;
  std::array<Mapping, 2> slots_;
  // The last write's result (RankWriteResult::tensors) and its JSON text, reused while equal.
  std::vector<TensorRecord> result_tensors_;
  std::string result_text_;
  int next_ = 0;  // the slot the next write goes to
};

// The newest snapshot (by generation, then step) that every rank of its world holds complete
// in a slot under `root`; nullopt when there is none. Reads only.
std::optional<SlotSnapshot> newest_slot_snapshot(const std::filesystem::path& root);

// The next generation's lead, after a failure: the newest slot snapshot newer than the newest
// committed step under `root`, each rank's checksum verified, committed as <root>/step_N.
// Returns its directory; nullopt when there is no newer one. A snapshot that fails its check
// (named in a warning) is passed over for the one before.
std::optional<std::filesystem::path> commit_slot_snapshot(const std::filesystem::path& root,
                                                          const CommitOptions& options = {});

// Removes every slot under `root` (a restored world's: its successor writes its own).
void remove_slots(const std::filesystem::path& root);

}  // namespace lattice
