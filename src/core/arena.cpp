#include "core/arena.h"

#include <spdlog/spdlog.h>

#include <sys/mman.h>

#include <cstdlib>

#include "core/error.h"

namespace lattice {

namespace {
size_t round_up(size_t n, size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// A chunk of at least `size` bytes from the system; `size` becomes what was reserved. Large
// chunks are whole huge pages, advised to be backed by them; where the kernel has no transparent
// huge pages the advice fails and 4 KiB pages serve, as before.
void* reserve_chunk(size_t& size) {
  if (size < Arena::kHugePageBytes) return std::aligned_alloc(Arena::kAlignment, size);
  size = round_up(size, Arena::kHugePageBytes);
  void* base = std::aligned_alloc(Arena::kHugePageBytes, size);
  if (base != nullptr) madvise(base, size, MADV_HUGEPAGE);
  return base;
}
}  // namespace

std::string_view memory_category_name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParameters:
      return "parameters";
    case MemoryCategory::kGradients:
      return "gradients";
    case MemoryCategory::kOptimizerState:
      return "optimizer_state";
    case MemoryCategory::kActivations:
      return "activations";
    case MemoryCategory::kWorkspace:
      return "workspace";
    case MemoryCategory::kCommunication:
      return "communication";
    case MemoryCategory::kOther:
      return "other";
  }
  return "?";
}

double MemoryStats::fragmentation() const {
  if (free_bytes == 0) return 0.0;
  return 1.0 - double(largest_free_block) / double(free_bytes);
}

Arena::Arena(std::string name, size_t chunk_bytes)
    : name_(std::move(name)),
      chunk_bytes_(round_up(std::max<size_t>(chunk_bytes, 1), kAlignment)) {}

Arena::~Arena() {
  if (!blocks_.empty()) {
    spdlog::warn("arena '{}' destroyed with {} live allocations ({} bytes)", name_, blocks_.size(),
                 stats_.live_bytes);
  }
  for (Chunk& chunk : chunks_) std::free(chunk.base);
}

size_t Arena::add_chunk(size_t min_bytes) {
  size_t size = std::max(chunk_bytes_, round_up(min_bytes, kAlignment));
  void* base = reserve_chunk(size);
  if (base == nullptr) {
    LATTICE_THROW(OutOfMemoryError,
                  "arena '{}': the system refused a chunk of {} bytes (live {} bytes, reserved {} "
                  "bytes) ---> HINT: reduce the micro-batch, enable recompute or shard more (ZeRO)",
                  name_, size, stats_.live_bytes, stats_.reserved_bytes);
  }
  chunks_.push_back(Chunk{static_cast<std::byte*>(base), size, {}});
  size_t index = chunks_.size() - 1;
  insert_free(index, 0, size);
  stats_.reserved_bytes += size;
  return index;
}

void Arena::insert_free(size_t chunk, size_t offset, size_t size) {
  chunks_[chunk].free_blocks.emplace(offset, size);
  free_by_size_.emplace(size, std::make_pair(chunk, offset));
  stats_.free_bytes += size;
}

void Arena::erase_free(size_t chunk, size_t offset, size_t size) {
  chunks_[chunk].free_blocks.erase(offset);
  auto [first, last] = free_by_size_.equal_range(size);
  for (auto it = first; it != last; ++it) {
    if (it->second == std::make_pair(chunk, offset)) {
      free_by_size_.erase(it);
      break;
    }
  }
  stats_.free_bytes -= size;
}

void* Arena::allocate(size_t bytes, MemoryCategory category) {
  std::lock_guard lock(mutex_);
  size_t size = round_up(std::max<size_t>(bytes, 1), kAlignment);
  auto best = free_by_size_.lower_bound(size);
  if (best == free_by_size_.end()) {
    add_chunk(size);
    best = free_by_size_.lower_bound(size);
  }
  auto [chunk, offset] = best->second;
  size_t free_size = best->first;
  erase_free(chunk, offset, free_size);
  if (free_size > size) insert_free(chunk, offset + size, free_size - size);

  void* ptr = chunks_[chunk].base + offset;
  blocks_.emplace(ptr, Block{chunk, offset, size, bytes, category});
  auto c = size_t(category);
  stats_.live_bytes += bytes;
  stats_.live_by_category[c] += bytes;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes);
  stats_.peak_by_category[c] = std::max(stats_.peak_by_category[c], stats_.live_by_category[c]);
  stats_.allocation_count = blocks_.size();
  return ptr;
}

void Arena::release(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end()) {
    spdlog::error("arena '{}': release of a pointer it did not allocate", name_);
    std::abort();
  }
  Block block = it->second;
  blocks_.erase(it);
  stats_.live_bytes -= block.requested;
  stats_.live_by_category[size_t(block.category)] -= block.requested;
  stats_.allocation_count = blocks_.size();

  // Coalesce with the free neighbours on both sides.
  Chunk& chunk = chunks_[block.chunk];
  size_t offset = block.offset;
  size_t size = block.size;
  auto next = chunk.free_blocks.lower_bound(offset);
  if (next != chunk.free_blocks.end() && next->first == offset + size) {
    size_t next_size = next->second;
    erase_free(block.chunk, next->first, next_size);
    size += next_size;
  }
  auto after = chunk.free_blocks.lower_bound(offset);
  if (after != chunk.free_blocks.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == offset) {
      size_t prev_offset = prev->first;
      size_t prev_size = prev->second;
      erase_free(block.chunk, prev_offset, prev_size);
      offset = prev_offset;
      size += prev_size;
    }
  }
  insert_free(block.chunk, offset, size);
}

MemoryStats Arena::stats() const {
  std::lock_guard lock(mutex_);
  MemoryStats s = stats_;
  s.largest_free_block = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  return s;
}

void Arena::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes = stats_.live_bytes;
  stats_.peak_by_category = stats_.live_by_category;
}

void Arena::trim() {
  std::lock_guard lock(mutex_);
  // A chunk is unused when its free list is one block spanning the whole chunk.
  for (size_t i = 0; i < chunks_.size(); ++i) {
    Chunk& chunk = chunks_[i];
    if (chunk.base == nullptr || chunk.free_blocks.size() != 1) continue;
    auto only = chunk.free_blocks.begin();
    if (only->first != 0 || only->second != chunk.size) continue;
    erase_free(i, 0, chunk.size);
    std::free(chunk.base);
    stats_.reserved_bytes -= chunk.size;
    chunk.base = nullptr;
    chunk.size = 0;
  }
}

}  // namespace lattice
