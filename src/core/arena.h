// The per-rank memory arena: every tensor's bytes come from here, so every byte is accounted
// for (DESIGN.md invariant 4).
//
// The arena reserves large chunks from the system and serves 64-byte-aligned blocks from them
// with a best-fit free list that coalesces neighbours on release. It reports live bytes (what
// callers asked for and still hold), peak live bytes, reserved bytes (chunks held from the
// system) and external fragmentation, overall and per MemoryCategory, so the planner's
// predictions can be compared with what a rank really used.
//
// Chunks of 2 MiB and more are 2 MiB-aligned whole huge pages and asked to be backed by them
// (madvise MADV_HUGEPAGE: Debian's transparent huge pages default to "madvise"). A step reads
// tensors all over tens of MiB (attention reads each head's rows a token apart), and 4 KiB pages
// then miss the TLB: the demo's fp32 step ran 4% faster on huge pages.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lattice {

enum class MemoryCategory : uint8_t {
  kParameters,
  kGradients,
  kOptimizerState,
  kActivations,
  kWorkspace,
  kCommunication,
  kOther,
};
inline constexpr size_t kMemoryCategoryCount = 7;
std::string_view memory_category_name(MemoryCategory category);

struct MemoryStats {
  size_t live_bytes = 0;      // requested bytes currently allocated
  size_t peak_bytes = 0;      // maximum of live_bytes since construction or reset_peak()
  size_t reserved_bytes = 0;  // bytes of the chunks held from the system
  size_t free_bytes = 0;      // bytes in free blocks of those chunks
  size_t largest_free_block = 0;
  size_t allocation_count = 0;  // live allocations
  std::array<size_t, kMemoryCategoryCount> live_by_category{};
  std::array<size_t, kMemoryCategoryCount> peak_by_category{};

  // External fragmentation: 1 - largest free block / free bytes (0 when nothing is free).
  // 0 means every free byte is usable by one allocation; near 1 means free space is scattered.
  double fragmentation() const;
};

class Arena {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kHugePageBytes = size_t(2) << 20;
  static constexpr size_t kDefaultChunkBytes = size_t(64) << 20;

  explicit Arena(std::string name = "arena", size_t chunk_bytes = kDefaultChunkBytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Returns kAlignment-aligned storage for `bytes` bytes (bytes == 0 gives a valid, unique
  // pointer). Throws OutOfMemoryError naming the arena, the request and the live bytes.
  void* allocate(size_t bytes, MemoryCategory category);
  // Returns a block to the free list; `ptr` must come from allocate() of this arena.
  void release(void* ptr) noexcept;

  MemoryStats stats() const;
  void reset_peak();
  // Returns chunks with no live block to the system.
  void trim();
  const std::string& name() const { return name_; }

 private:
  struct Chunk {
    std::byte* base = nullptr;
    size_t size = 0;
    std::map<size_t, size_t> free_blocks;  // offset -> size, ordered for coalescing
  };
  struct Block {
    size_t chunk = 0;
    size_t offset = 0;
    size_t size = 0;       // rounded, as carved from the chunk
    size_t requested = 0;  // as asked for, counted in live bytes
    MemoryCategory category = MemoryCategory::kOther;
  };

  size_t add_chunk(size_t min_bytes);
  void insert_free(size_t chunk, size_t offset, size_t size);
  void erase_free(size_t chunk, size_t offset, size_t size);

  std::string name_;
  size_t chunk_bytes_;
  mutable std::mutex mutex_;
  std::vector<Chunk> chunks_;
  std::multimap<size_t, std::pair<size_t, size_t>> free_by_size_;  // size -> (chunk, offset)
  std::unordered_map<void*, Block> blocks_;
  MemoryStats stats_;
};

}  // namespace lattice
