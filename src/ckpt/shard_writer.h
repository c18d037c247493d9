// Writing a sharded checkpoint, in two phases so that each rank writes only what it owns:
//
//   1. every rank:      write_rank_shards(staging, rank, owned)  -> RankWriteResult
//      (gather the results to one rank, e.g. as rank_write_result_to_json strings)
//   2. committing rank: CheckpointRoot::commit(manifest, results) -> <root>/step_N
//
// The commit protocol (DESIGN.md invariant 5: a valid checkpoint never becomes invalid):
//   shard files written into <root>/step_N.tmp/ and fsynced (AtomicFileWriter)
//   -> manifest.json written last (temp, fsync, rename, fsync of the directory)
//   -> step_N.tmp renamed to step_N, <root> fsynced
//   -> <root>/latest ("step_N\n") replaced by temp + rename
//   -> only then the oldest step_* beyond keep_last deleted.
// A crash anywhere leaves either no step_N (the .tmp directory is ignored by readers and
// removed by the next save of that step) or a complete, verifiable step_N.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/manifest.h"
#include "ckpt/safetensors.h"
#include "ckpt/shard_box.h"
#include "core/arena.h"
#include "core/rank_progress.h"
#include "core/tensor.h"

namespace lattice {

// A piece of a global tensor that this rank owns: box `box` of `name` (shard_box.h: per
// dimension [offset, offset + length), or a flat range), values in `data`, contiguous row-major
// (numel box.numel(); the writer reads them, never keeps them). A tensor replicated over dp or
// tp is passed by its owner only (e.g. dp rank 0, tp rank 0).
struct OwnedShard {
  std::string name;
  Shape global_shape;
  ShardBox box;
  Tensor data;

  static OwnedShard whole(std::string name, Tensor data);
  // Rows [row_begin, row_end) along dimension 0; data holds (row_end - row_begin, the global
  // shape's other dimensions) elements.
  static OwnedShard rows(std::string name, Shape global_shape, int64_t row_begin, int64_t row_end,
                         Tensor data);
  // Elements [begin, end) of the global tensor flattened row-major (a ZeRO partition's cut).
  static OwnedShard elements(std::string name, Shape global_shape, int64_t begin, int64_t end,
                             Tensor data);
  // The part of a local tensor that `where` places (local_placements). Borrows the local memory
  // when the part is contiguous in it; otherwise copies it into `scratch` (ValueError naming the
  // tensor when `scratch` is null).
  static OwnedShard from_local(std::string name, Shape global_shape, const BoxPlacement& where,
                               Arena* scratch);
};

std::string rank_file_name(int rank);  // "rank_00003.safetensors"

// A rank's shard file before it is written: the writer holding `shards` (by reference: they
// must outlive it) and the result to record, its file's size and checksum still unset.
struct RankShardFile {
  SafetensorsWriter writer;
  RankWriteResult result;
};
RankShardFile rank_shard_file(int rank, const std::vector<OwnedShard>& shards);

// Phase 1: writes `shards` into <staging>/rank_NNNNN.safetensors (fsynced, renamed into place).
// A whole tensor is stored under its name and global shape, a box under "name@o0:e0,o1:e1" with
// the box's shape, a flat range under "name@begin:end" as a 1-D tensor. ValueError for a shard
// whose data does not hold box.numel() elements or whose box lies outside its global shape.
// `reuse`: an old shard file to write over if it exists (CommitOptions::recycle_pruned).
RankWriteResult write_rank_shards(const std::filesystem::path& staging, int rank,
                                  const std::vector<OwnedShard>& shards,
                                  const std::filesystem::path& reuse = {});

// The points of the protocol a test can interrupt (a hook that throws or kills the process).
enum class CommitStage : uint8_t {
  kStagingCreated,    // empty step_N.tmp exists
  kShardsWritten,     // every shard file is in step_N.tmp, no manifest yet
  kManifestWritten,   // step_N.tmp is complete
  kDirectoryRenamed,  // step_N is committed, `latest` still names the previous one
  kLatestUpdated,     // `latest` names step_N, old checkpoints not yet pruned
  kPruned,            // done
};
std::string_view commit_stage_name(CommitStage stage);

struct CommitOptions {
  int keep_last = 0;  // committed checkpoints to keep (the new one included); 0 keeps all
  // Multi-rank saves (collective_save.h): how long ranks wait for each other's writes and for
  // the commit (a large shard on a slow disk takes minutes, far past a collective's default).
  std::chrono::milliseconds peer_timeout{std::chrono::minutes(10)};
  // Tests only: called on every rank (with its world rank) just before it writes its shard file,
  // on the thread that writes it; a throw is that rank's write failing (a full disk).
  std::function<void(int rank)> before_write = {};
  std::function<void(CommitStage)> hook = {};  // tests only: called as each stage is reached
  // The phase each rank's shard write reports (report_nested_phase), once the staging directory
  // exists and before its file is written: a fault injected there (kill@checkpoint) leaves the
  // save half written, never committed. Elastic snapshots over several nodes: kSnapshot.
  Phase write_phase = Phase::kCheckpoint;
  // Called by the committing rank just before the rename that makes a checkpoint visible; a
  // throw refuses the commit (an elastic rank whose generation was replaced: docs/elastic.md).
  std::function<void()> fence = {};
  // Elastic snapshots (collective_async_saver.h): each rank also records its finished write in
  // the staging directory, and a save abandoned in flight keeps its staging directory, so that
  // the next generation can commit a save every rank had written (commit_written_staging).
  bool record_writes = false;
  // Elastic snapshots over several nodes (one node: snapshot_slots.h): save() writes this rank's
  // shard (and its record) on the calling thread, at the step boundary, straight from the live
  // tensors instead of copying them for a background write: the copy in shared memory is
  // complete before the next step starts, so a fault in the next step's forward still finds it.
  // Only the replication and the commit stay asynchronous.
  bool write_at_save = false;
  // Elastic snapshots over several nodes, each writing to a root of its own (its shared memory):
  // the node of each world rank. Each node's first rank prepares and commits its node's copy;
  // empty: one root every rank shares, rank 0 commits.
  std::vector<int> node_of_rank = {};
  // With node_of_rank: called on the write thread once this rank's shard and its record are
  // written, to copy them to another node's root (and receive that node's copies), so that a lost
  // node loses no state; a throw fails this rank's write.
  std::function<void(const std::filesystem::path& staging, int rank)> replicate = {};
  // With node_of_rank: the ranks whose shards this rank's node's copy holds once replicated (its
  // own and those it keeps); the node's first rank commits its copy only when it holds them all,
  // and the commit checks only their files.
  std::vector<int> kept_ranks = {};
  // Elastic snapshots in shared memory: a pruned checkpoint's shard files are kept in
  // CheckpointRoot::recycled_file for the next save to write over instead of new files (a new
  // file's pages cost more than the write itself: 2.6-2.9 ms against 1.0-1.3 ms for 5 MB).
  bool recycle_pruned = false;
};

// A directory of checkpoints step_N plus the `latest` pointer.
class CheckpointRoot {
 public:
  explicit CheckpointRoot(std::filesystem::path root);

  const std::filesystem::path& path() const { return root_; }
  std::filesystem::path step_dir(int64_t step) const;     // <root>/step_N
  std::filesystem::path staging_dir(int64_t step) const;  // <root>/step_N.tmp
  // <root>/recycled/<file>: a pruned shard file kept to be written over (recycle_pruned).
  std::filesystem::path recycled_file(const std::string& file) const;
  // Creates an empty staging directory for `step` (removing a stale one from a crash). One
  // rank calls it before the others write (they wait on a barrier).
  std::filesystem::path prepare_staging(int64_t step) const;
  // Phase 2: commits the staged step (manifest.step), updates `latest`, prunes beyond keep_last.
  std::filesystem::path commit(Manifest manifest, const std::vector<RankWriteResult>& results,
                               const CommitOptions& options = {}) const;

  // Steps of the step_N directories present, newest first (no validity check: see
  // resume_auto). Staging and foreign directories are ignored.
  std::vector<int64_t> committed_steps() const;
  // The step `latest` names, if the file exists and parses.
  std::optional<int64_t> latest_step() const;

 private:
  std::filesystem::path root_;
};

// Where a save commits, the one destination every save takes: by default the step_N directory
// of a checkpoint root (updating `latest`, pruning beyond keep_last), or with `directory` one
// directory itself (a run's "final": staged in "<dir>.tmp"; an existing one is replaced only once
// the new one is complete, and no `latest` is written).
class CheckpointTarget {
 public:
  CheckpointTarget(std::filesystem::path root);  // NOLINT(google-explicit-constructor): a root
  CheckpointTarget(CheckpointRoot root);         // NOLINT(google-explicit-constructor)
  static CheckpointTarget directory(std::filesystem::path dir);

  std::filesystem::path committed_dir(int64_t step) const;
  std::filesystem::path staging_dir(int64_t step) const;
  // Creates an empty staging directory for `step` (and its parents; a stale one is removed).
  std::filesystem::path prepare_staging(int64_t step) const;
  // Writes the manifest (merging `results`) and makes the staged step the committed directory.
  std::filesystem::path commit(Manifest manifest, const std::vector<RankWriteResult>& results,
                               const CommitOptions& options = {}) const;

 private:
  CheckpointTarget(CheckpointRoot root, bool fixed_directory);

  CheckpointRoot root_;  // the root, or for a fixed directory the directory itself
  bool fixed_directory_ = false;
};

// One rank holding everything: phases 1 and 2 in one call. Returns the committed directory.
std::filesystem::path save_sharded_checkpoint(const CheckpointTarget& target, Manifest manifest,
                                              const std::vector<OwnedShard>& shards,
                                              const CommitOptions& options = {});

}  // namespace lattice
