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

void AsyncCheckpointSaver::reserve(const std::vector<OwnedShard>& shards) {
  wait();
  snapshot_.reserve(shards);
}

void AsyncCheckpointSaver::save(Manifest manifest, const std::vector<OwnedShard>& shards) {
  wait();
  // Buffers of the previous save are reused when the shards have the same shapes (every save
  // of a run): the copy then touches no fresh pages, which is most of its cost.
  snapshot_.take(shards);
  fs::create_directories(root_.path());
  pending_ = std::async(std::launch::async, [this, manifest = std::move(manifest)]() mutable {
    const int64_t step = manifest.step;
    try {
      save_sharded_checkpoint(root_, std::move(manifest), snapshot_.shards(), options_);
    } catch (...) {
      // Nothing committed: the staging directory is the only trace, and it goes too.
      std::error_code ec;
      fs::remove_all(root_.staging_dir(step), ec);
      throw;
    }
  });
}

}  // namespace lattice
