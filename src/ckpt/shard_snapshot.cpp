#include "ckpt/shard_snapshot.h"

namespace lattice {

bool ShardSnapshot::fits(const std::vector<OwnedShard>& shards) const {
  if (shards_.size() != shards.size()) return false;
  for (size_t i = 0; i < shards.size(); ++i) {
    const Tensor& have = shards_[i].data;
    if (have.shape() != shards[i].data.shape() || have.dtype() != shards[i].data.dtype()) {
      return false;
    }
  }
  return true;
}

void ShardSnapshot::allocate(const std::vector<OwnedShard>& shards) {
  shards_.clear();
  for (const OwnedShard& s : shards) {
    shards_.push_back(
        {s.name, s.global_shape, s.box,
         Tensor::empty(arena_, s.data.shape(), s.data.dtype(), MemoryCategory::kOther)});
  }
}

void ShardSnapshot::reserve(const std::vector<OwnedShard>& shards) {
  if (fits(shards)) return;
  allocate(shards);
  for (OwnedShard& s : shards_) s.data.zero_();  // fault the pages in now, not in take()
}

void ShardSnapshot::take(const std::vector<OwnedShard>& shards) {
  if (!fits(shards)) allocate(shards);
  for (size_t i = 0; i < shards.size(); ++i) {
    const OwnedShard& s = shards[i];
    OwnedShard& copy = shards_[i];
    copy.name = s.name;
    copy.global_shape = s.global_shape;
    copy.box = s.box;
    copy.data.copy_from(s.data);
  }
}

}  // namespace lattice
