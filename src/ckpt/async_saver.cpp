#include "ckpt/async_saver.h"

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace lattice {

namespace fs = std::filesystem;

AsyncCheckpointSaver::AsyncCheckpointSaver(fs::path root, CommitOptions options)
    : root_(std::move(root)), options_(std::move(options)) {}

AsyncCheckpointSaver::~AsyncCheckpointSaver() {
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("asynchronous checkpoint save failed, nothing was committed: {}", e.what());
  }
}

void AsyncCheckpointSaver::wait() {
  if (!pending_.valid()) return;
  std::future<void> done = std::move(pending_);
  done.get();
}

bool AsyncCheckpointSaver::snapshot_fits(const std::vector<OwnedShard>& shards) const {
  if (snapshot_.size() != shards.size()) return false;
  for (size_t i = 0; i < shards.size(); ++i) {
    const Tensor& have = snapshot_[i].data;
    if (have.shape() != shards[i].data.shape() || have.dtype() != shards[i].data.dtype()) {
      return false;
    }
  }
  return true;
}

void AsyncCheckpointSaver::allocate_snapshot(const std::vector<OwnedShard>& shards) {
  snapshot_.clear();
  for (const OwnedShard& s : shards) {
    snapshot_.push_back(
        {s.name, s.global_shape, s.box,
         Tensor::empty(arena_, s.data.shape(), s.data.dtype(), MemoryCategory::kOther)});
  }
}

void AsyncCheckpointSaver::reserve(const std::vector<OwnedShard>& shards) {
  wait();
  if (snapshot_fits(shards)) return;
  allocate_snapshot(shards);
  for (OwnedShard& s : snapshot_) s.data.zero_();  // fault the pages in now, not in save()
}

void AsyncCheckpointSaver::save(Manifest manifest, const std::vector<OwnedShard>& shards) {
  wait();
  // Buffers of the previous save are reused when the shards have the same shapes (every save
  // of a run): the copy then touches no fresh pages, which is most of its cost.
  if (!snapshot_fits(shards)) allocate_snapshot(shards);
  for (size_t i = 0; i < shards.size(); ++i) {
    const OwnedShard& s = shards[i];
    OwnedShard& copy = snapshot_[i];
    copy.name = s.name;
    copy.global_shape = s.global_shape;
    copy.box = s.box;
    copy.data.copy_from(s.data);
  }
  fs::create_directories(root_.path());
  pending_ = std::async(std::launch::async, [this, manifest = std::move(manifest)]() mutable {
    const int64_t step = manifest.step;
    try {
      save_sharded_checkpoint(root_, std::move(manifest), snapshot_, options_);
    } catch (...) {
      // Nothing committed: the staging directory is the only trace, and it goes too.
      std::error_code ec;
      fs::remove_all(root_.staging_dir(step), ec);
      throw;
    }
  });
}

}  // namespace lattice
