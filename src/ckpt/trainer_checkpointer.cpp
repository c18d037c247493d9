#include "ckpt/trainer_checkpointer.h"

#include "ckpt/checkpoint.h"
#include "ckpt/trainer_checkpoint.h"
#include "core/timer.h"

namespace lattice {

namespace fs = std::filesystem;

TrainerCheckpointer::TrainerCheckpointer(fs::path root, Trainer& trainer, Communicator& world,
                                         TrainerCheckpointOptions options)
    : root_(std::move(root)), trainer_(trainer), world_(world), commit_(options.commit) {
  expect_world_of(trainer_, world_.size());
  if (options.slots_of_generation) {
    slots_ = std::make_unique<SnapshotSlotWriter>(
        root_, world_.rank(), *options.slots_of_generation, commit_.fence, options.while_slot_torn);
    slots_->reserve(trainer_manifest(trainer_), trainer_shards(trainer_, *scratch_));
    return;
  }
  if (!options.async) return;
  async_ = std::make_unique<CollectiveAsyncSaver>(root_, world_, commit_);
  async_->reserve(trainer_shards(trainer_, *scratch_));
}

double TrainerCheckpointer::save() {
  Stopwatch stall;
  if (slots_ != nullptr) {
    slots_->write(trainer_manifest(trainer_), trainer_shards(trainer_, *scratch_));
    return stall.seconds();
  }
  if (async_ == nullptr) {
    last_sync_ = save_trainer_checkpoint(root_, trainer_, &world_, commit_);
    return stall.seconds();
  }
  // c_attn's q|k|v columns are copied into the scratch arena, then snapshotted.
  async_->save(trainer_manifest(trainer_), trainer_shards(trainer_, *scratch_));
  return stall.seconds();
}

void TrainerCheckpointer::wait_written() const {
  if (async_ != nullptr) async_->wait_written();
}

void TrainerCheckpointer::after_step() {
  if (async_ != nullptr) async_->poll();
}

void TrainerCheckpointer::finish() {
  if (async_ != nullptr) async_->wait();
}

const std::optional<fs::path>& TrainerCheckpointer::last_committed() const {
  return async_ != nullptr ? async_->last_committed() : last_sync_;
}

}  // namespace lattice
