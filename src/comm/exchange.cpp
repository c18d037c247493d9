#include "comm/exchange.h"

namespace lattice {

Blocks Blocks::uniform(int n, int64_t per_rank) {
  Blocks b;
  for (int v = 0; v <= n; ++v) b.begin.push_back(per_rank * v);
  return b;
}

Blocks Blocks::balanced(int n, int64_t count) {
  Blocks b;
  for (int v = 0; v <= n; ++v) b.begin.push_back(count * v / n);
  return b;
}

uint64_t collective_tag_base(uint32_t user_tag, uint64_t seq) {
  return (uint64_t(1) << 63) | ((uint64_t(user_tag) & 0x7fffff) << 40) | ((seq & 0xffffff) << 16);
}

Exchange::Exchange(Transport& transport, const std::vector<int>& members, int group_rank, int root,
                   uint64_t context, uint64_t tag_base, Deadline deadline, DType dtype, ReduceOp op)
    : transport_(transport),
      members_(members),
      vrank_((group_rank - root + int(members.size())) % int(members.size())),
      root_(root),
      context_(context),
      tag_base_(tag_base),
      deadline_(deadline),
      dtype_(dtype),
      op_(op),
      element_size_(dtype_size(dtype)) {}

int Exchange::world_rank_of(int vpeer) const {
  int n = size();
  return members_[size_t((vpeer + root_) % n)];
}

MessageKey Exchange::key(int step) const {
  LATTICE_CHECK(step >= 0 && step < 4096 && phase_ < 16, "step {} phase {}", step, phase_);
  return MessageKey{context_, tag_base_ | (uint64_t(phase_) << 12) | uint64_t(step)};
}

PendingSendPtr Exchange::send(int vpeer, int step, const void* base, int64_t begin, int64_t end) {
  const auto* bytes = static_cast<const std::byte*>(base) + size_t(begin) * element_size_;
  return transport_.post_send(world_rank_of(vpeer), key(step), bytes,
                              size_t(end - begin) * element_size_);
}

void Exchange::recv(int vpeer, int step, void* base, int64_t begin, int64_t end) {
  auto* bytes = static_cast<std::byte*>(base) + size_t(begin) * element_size_;
  transport_.recv(world_rank_of(vpeer), key(step), bytes, size_t(end - begin) * element_size_,
                  deadline_);
}

void Exchange::recv_reduce(int vpeer, int step, void* base, int64_t begin, int64_t end) {
  auto* bytes = static_cast<std::byte*>(base) + size_t(begin) * element_size_;
  transport_.recv_reduce(world_rank_of(vpeer), key(step), bytes, end - begin, dtype_, op_,
                         deadline_);
}

}  // namespace lattice
