#include "ckpt/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>  // renameat2, RENAME_EXCHANGE

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "core/error.h"

namespace lattice {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLatestFileName = "latest";
constexpr const char* kRecycledDirName = "recycled";

// Moves the shard files of a checkpoint being pruned into `recycled` (replacing older ones).
// Best effort: a file not moved is only freed with its directory.
void recycle_shard_files(const fs::path& dir, const fs::path& recycled) {
  std::error_code ec;
  fs::create_directories(recycled, ec);
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("rank_") && name.ends_with(".safetensors")) {
      fs::rename(entry.path(), recycled / name, ec);
    }
  }
}

void call_hook(const CommitOptions& options, CommitStage stage) {
  if (options.hook) options.hook(stage);
}

// A rename is durable only once its directory is flushed.
void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    LATTICE_THROW(IoError, "cannot open directory '{}' to flush it: {}", dir.string(),
                  std::strerror(errno));
  }
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) {
    LATTICE_THROW(IoError, "cannot flush directory '{}': {}", dir.string(), std::strerror(errno));
  }
}

// Puts complete directory `staging` in place of existing `target`. An atomic exchange where the
// file system has one (Linux renameat2), so no instant is without a valid `target`; otherwise
// the old one is moved aside first and removed only after the new one is in place.
void replace_directory(const fs::path& staging, const fs::path& target) {
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(staging);  // now the previous contents of target
    return;
  }
  const fs::path displaced = target.string() + ".old";
  fs::remove_all(displaced);
  fs::rename(target, displaced);
  fs::rename(staging, target);
  fs::remove_all(displaced);
}

// "step_120" -> 120; nullopt for anything else ("step_120.tmp", "step_x").
std::optional<int64_t> parse_step_name(const std::string& name) {
  constexpr std::string_view prefix = "step_";
  if (!name.starts_with(prefix) || name.size() == prefix.size()) return std::nullopt;
  int64_t step = 0;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  auto [ptr, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || ptr != last || step < 0) return std::nullopt;
  return step;
}

}  // namespace

OwnedShard OwnedShard::whole(std::string name, Tensor data) {
  Shape shape = data.shape();
  ShardBox box = ShardBox::whole(shape);
  return {std::move(name), std::move(shape), std::move(box), std::move(data)};
}

OwnedShard OwnedShard::rows(std::string name, Shape global_shape, int64_t row_begin,
                            int64_t row_end, Tensor data) {
  LATTICE_CHECK(global_shape.rank() >= 1, "shard of '{}': a row range needs rank >= 1", name);
  ShardBox box = ShardBox::whole(global_shape);
  box.offsets[0] = row_begin;
  box.lengths[0] = row_end - row_begin;
  return {std::move(name), std::move(global_shape), std::move(box), std::move(data)};
}

OwnedShard OwnedShard::elements(std::string name, Shape global_shape, int64_t begin, int64_t end,
                                Tensor data) {
  return {std::move(name), std::move(global_shape), ShardBox::flat(begin, end), std::move(data)};
}

OwnedShard OwnedShard::from_local(std::string name, Shape global_shape, const BoxPlacement& where,
                                  Arena* scratch) {
  const Shape shape(where.box.lengths);
  if (where.contiguous()) {
    Tensor data = Tensor::borrow(where.base, shape, where.dtype);
    return {std::move(name), std::move(global_shape), where.box, std::move(data)};
  }
  if (scratch == nullptr) {
    LATTICE_THROW(ValueError,
                  "shard {} of '{}' {} is not contiguous in the local tensor and no scratch arena "
                  "was given to copy it ---> HINT: pass an Arena (training_shards does)",
                  where.box.to_string(), name, global_shape.to_string());
  }
  Tensor data = Tensor::empty(*scratch, shape, where.dtype, MemoryCategory::kOther);
  copy_overlap(where, contiguous_placement(where.box, static_cast<std::byte*>(data.raw_data()),
                                           where.dtype));
  return {std::move(name), std::move(global_shape), where.box, std::move(data)};
}

std::string rank_file_name(int rank) {
  return fmt::format("rank_{:05d}.safetensors", rank);
}

RankShardFile rank_shard_file(int rank, const std::vector<OwnedShard>& shards) {
  RankShardFile out;
  RankWriteResult& result = out.result;
  SafetensorsWriter& writer = out.writer;
  result.file.name = rank_file_name(rank);
  writer.add_metadata("format", "lattice-checkpoint-shard");
  writer.add_metadata("rank", std::to_string(rank));
  for (const OwnedShard& s : shards) {
    const std::string what = fmt::format("shard of '{}' {}", s.name, s.global_shape.to_string());
    as_tensor_boxes(s.box, s.global_shape, what);  // inside the tensor, or ValueError
    if (s.data.numel() != s.box.numel()) {
      LATTICE_THROW(ValueError,
                    "{}: box {} with data {} do not fit ---> HINT: data must hold the box's "
                    "elements, contiguous",
                    what, s.box.to_string(), s.data.describe());
    }
    if (s.box.numel() == 0) continue;  // nothing to store
    std::string key;
    Shape stored;
    if (s.box.covers_whole(s.global_shape)) {
      key = s.name;
      stored = s.global_shape;
    } else if (s.box.is_flat_range_of(s.global_shape)) {
      key = fmt::format("{}@{}:{}", s.name, s.box.offsets[0], s.box.offsets[0] + s.box.lengths[0]);
      stored = Shape{s.box.numel()};
    } else {
      key = s.name + "@";
      for (int d = 0; d < s.box.rank(); ++d) {
        key += fmt::format("{}{}:{}", d == 0 ? "" : ",", s.box.offsets[size_t(d)],
                           s.box.offsets[size_t(d)] + s.box.lengths[size_t(d)]);
      }
      stored = Shape(s.box.lengths);
    }
    writer.add(key, s.data.view(stored));
    result.tensors.push_back(
        {s.name, s.global_shape, s.data.dtype(), {{result.file.name, key, s.box}}});
  }
  return out;
}

RankWriteResult write_rank_shards(const fs::path& staging, int rank,
                                  const std::vector<OwnedShard>& shards, const fs::path& reuse) {
  RankShardFile file = rank_shard_file(rank, shards);
  const SafetensorsFileSummary summary = file.writer.write(staging / file.result.file.name, reuse);
  file.result.file.size = summary.size;
  file.result.file.crc32c = summary.crc32c;
  return file.result;
}

std::string_view commit_stage_name(CommitStage stage) {
  switch (stage) {
    case CommitStage::kStagingCreated:
      return "staging-created";
    case CommitStage::kShardsWritten:
      return "shards-written";
    case CommitStage::kManifestWritten:
      return "manifest-written";
    case CommitStage::kDirectoryRenamed:
      return "directory-renamed";
    case CommitStage::kLatestUpdated:
      return "latest-updated";
    case CommitStage::kPruned:
      return "pruned";
  }
  return "?";
}

namespace {

// Writes the manifest into `staging` (merging `results`) and renames `staging` to `target`.
// An existing `target` is replaced only after the new one is complete.
void commit_checkpoint_dir(const fs::path& staging, const fs::path& target, Manifest manifest,
                           const std::vector<RankWriteResult>& results,
                           const CommitOptions& options) {
  // A node's copy of a snapshot on more than two nodes holds only the kept ranks' files.
  std::set<std::string> held;
  for (int r : options.kept_ranks) held.insert(results.at(size_t(r)).file.name);
  merge_rank_results(results, manifest);
  for (const FileRecord& f : manifest.files) {
    if (!options.kept_ranks.empty() && !held.contains(f.name)) continue;
    std::error_code ec;
    uint64_t size = fs::file_size(staging / f.name, ec);
    if (ec || size != f.size) {
      LATTICE_THROW(IoError, "cannot commit '{}': shard file '{}' is missing or not {} bytes",
                    target.string(), (staging / f.name).string(), f.size);
    }
  }
  // AtomicFileWriter flushes the file and then the staging directory itself.
  write_file_atomically(staging / kManifestFileName, manifest_to_text(manifest));
  call_hook(options, CommitStage::kManifestWritten);

  if (options.fence) options.fence();
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  try {
    if (fs::exists(target)) {
      replace_directory(staging, target);
    } else {
      fs::rename(staging, target);
    }
  } catch (const fs::filesystem_error& e) {
    LATTICE_THROW(IoError, "cannot commit checkpoint '{}' from '{}': {}", target.string(),
                  staging.string(), e.what());
  }
  fsync_dir(parent);
  call_hook(options, CommitStage::kDirectoryRenamed);
}

// Creates `staging` empty (removing a stale one from a crash), with its parents.
fs::path create_empty_staging(const fs::path& staging) {
  std::error_code ec;
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  if (ec) {
    LATTICE_THROW(IoError,
                  "cannot create checkpoint staging directory '{}': {} ---> HINT: check "
                  "that the checkpoint directory is writable",
                  staging.string(), ec.message());
  }
  return staging;
}

}  // namespace

CheckpointRoot::CheckpointRoot(fs::path root) : root_(std::move(root)) {}

fs::path CheckpointRoot::step_dir(int64_t step) const {
  return root_ / fmt::format("step_{}", step);
}

fs::path CheckpointRoot::staging_dir(int64_t step) const {
  return root_ / fmt::format("step_{}.tmp", step);
}

fs::path CheckpointRoot::recycled_file(const std::string& file) const {
  return root_ / kRecycledDirName / file;
}

fs::path CheckpointRoot::prepare_staging(int64_t step) const {
  return create_empty_staging(staging_dir(step));
}

fs::path CheckpointRoot::commit(Manifest manifest, const std::vector<RankWriteResult>& results,
                                const CommitOptions& options) const {
  const int64_t step = manifest.step;
  const fs::path target = step_dir(step);
  commit_checkpoint_dir(staging_dir(step), target, std::move(manifest), results, options);

  write_file_atomically(root_ / kLatestFileName, target.filename().string() + "\n");
  call_hook(options, CommitStage::kLatestUpdated);

  if (options.keep_last > 0) {
    // Only checkpoints older than the new one are candidates, and only now that it is
    // committed; newer ones (left by a run that resumed from further back) are not ours to drop.
    int kept = 1;  // the new one
    for (int64_t s : committed_steps()) {
      if (s >= step) continue;
      if (kept < options.keep_last) {
        ++kept;
        continue;
      }
      std::error_code ec;
      if (options.recycle_pruned) recycle_shard_files(step_dir(s), root_ / kRecycledDirName);
      fs::remove_all(step_dir(s), ec);
      if (ec) {
        LATTICE_THROW(IoError, "checkpoint {} is committed, but pruning '{}' failed: {}",
                      target.string(), step_dir(s).string(), ec.message());
      }
    }
  }
  call_hook(options, CommitStage::kPruned);
  return target;
}

std::vector<int64_t> CheckpointRoot::committed_steps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    if (!entry.is_directory()) continue;
    if (auto step = parse_step_name(entry.path().filename().string())) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::optional<int64_t> CheckpointRoot::latest_step() const {
  std::ifstream in(root_ / kLatestFileName);
  std::string name;
  if (!(in >> name)) return std::nullopt;
  return parse_step_name(name);
}

CheckpointTarget::CheckpointTarget(fs::path root) : CheckpointTarget(CheckpointRoot(root), false) {}

CheckpointTarget::CheckpointTarget(CheckpointRoot root)
    : CheckpointTarget(std::move(root), false) {}

CheckpointTarget::CheckpointTarget(CheckpointRoot root, bool fixed_directory)
    : root_(std::move(root)), fixed_directory_(fixed_directory) {}

CheckpointTarget CheckpointTarget::directory(fs::path dir) {
  return CheckpointTarget(CheckpointRoot(std::move(dir)), true);
}

fs::path CheckpointTarget::committed_dir(int64_t step) const {
  return fixed_directory_ ? root_.path() : root_.step_dir(step);
}

fs::path CheckpointTarget::staging_dir(int64_t step) const {
  return fixed_directory_ ? fs::path(root_.path().string() + ".tmp") : root_.staging_dir(step);
}

fs::path CheckpointTarget::prepare_staging(int64_t step) const {
  return fixed_directory_ ? create_empty_staging(staging_dir(step)) : root_.prepare_staging(step);
}

fs::path CheckpointTarget::commit(Manifest manifest, const std::vector<RankWriteResult>& results,
                                  const CommitOptions& options) const {
  if (!fixed_directory_) return root_.commit(std::move(manifest), results, options);
  const fs::path target = committed_dir(manifest.step);
  commit_checkpoint_dir(staging_dir(manifest.step), target, std::move(manifest), results, options);
  return target;
}

fs::path save_sharded_checkpoint(const CheckpointTarget& target, Manifest manifest,
                                 const std::vector<OwnedShard>& shards,
                                 const CommitOptions& options) {
  const fs::path staging = target.prepare_staging(manifest.step);
  call_hook(options, CommitStage::kStagingCreated);
  if (options.before_write) options.before_write(0);
  report_nested_phase(options.write_phase);
  std::vector<RankWriteResult> results{write_rank_shards(staging, 0, shards)};
  call_hook(options, CommitStage::kShardsWritten);
  return target.commit(std::move(manifest), results, options);
}

}  // namespace lattice
