#include "core/arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"

namespace lattice {
namespace {

// The VmFlags line of the mapping holding `address` in /proc/self/smaps ("" when none holds it).
std::string mapping_flags(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t start = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> start >> dash >> end && dash == '-') {
      inside = start <= at && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line + " ";
    }
  }
  return "";
}

TEST(Arena, LiveAndPeakBytesAreExactForAScriptedSequence) {
  Arena arena("test", 1 << 20);
  void* a = arena.allocate(1000, MemoryCategory::kParameters);
  void* b = arena.allocate(3000, MemoryCategory::kActivations);
  EXPECT_EQ(arena.stats().live_bytes, 4000u);
  EXPECT_EQ(arena.stats().peak_bytes, 4000u);
  arena.release(a);
  EXPECT_EQ(arena.stats().live_bytes, 3000u);
  EXPECT_EQ(arena.stats().peak_bytes, 4000u);
  void* c = arena.allocate(500, MemoryCategory::kGradients);
  void* d = arena.allocate(2000, MemoryCategory::kActivations);
  MemoryStats s = arena.stats();
  EXPECT_EQ(s.live_bytes, 5500u);
  EXPECT_EQ(s.peak_bytes, 5500u);
  EXPECT_EQ(s.allocation_count, 3u);
  EXPECT_EQ(s.live_by_category[size_t(MemoryCategory::kActivations)], 5000u);
  EXPECT_EQ(s.live_by_category[size_t(MemoryCategory::kGradients)], 500u);
  EXPECT_EQ(s.peak_by_category[size_t(MemoryCategory::kParameters)], 1000u);
  EXPECT_EQ(s.live_by_category[size_t(MemoryCategory::kParameters)], 0u);
  arena.release(b);
  arena.release(c);
  arena.release(d);
  s = arena.stats();
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.peak_bytes, 5500u);
  EXPECT_EQ(s.allocation_count, 0u);
  arena.reset_peak();
  EXPECT_EQ(arena.stats().peak_bytes, 0u);
}

TEST(Arena, BlocksAreAlignedAndDistinct) {
  Arena arena("test", 4096);
  void* a = arena.allocate(0, MemoryCategory::kOther);
  void* b = arena.allocate(1, MemoryCategory::kOther);
  void* c = arena.allocate(100000, MemoryCategory::kOther);  // larger than a chunk
  EXPECT_NE(a, b);
  for (void* p : {a, b, c}) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % Arena::kAlignment, 0u);
  arena.release(a);
  arena.release(b);
  arena.release(c);
}

TEST(Arena, ReleasedNeighboursCoalesceSoFragmentationReturnsToZero) {
  Arena arena("test", 64 * 10);
  void* blocks[10];
  for (auto& b : blocks) b = arena.allocate(64, MemoryCategory::kWorkspace);
  EXPECT_EQ(arena.stats().free_bytes, 0u);
  // Free every other block: 5 separate holes of 64 bytes.
  for (int i = 0; i < 10; i += 2) arena.release(blocks[i]);
  MemoryStats s = arena.stats();
  EXPECT_EQ(s.free_bytes, 320u);
  EXPECT_EQ(s.largest_free_block, 64u);
  EXPECT_DOUBLE_EQ(s.fragmentation(), 1.0 - 64.0 / 320.0);
  // A 128-byte request cannot use any hole: it needs a new chunk.
  void* big = arena.allocate(128, MemoryCategory::kWorkspace);
  EXPECT_EQ(arena.stats().reserved_bytes, 2u * 640u);
  arena.release(big);
  for (int i = 1; i < 10; i += 2) arena.release(blocks[i]);
  s = arena.stats();
  EXPECT_EQ(s.free_bytes, s.reserved_bytes);
  EXPECT_DOUBLE_EQ(s.fragmentation(), 1.0 - 640.0 / 1280.0);  // two whole chunks
  arena.trim();
  EXPECT_EQ(arena.stats().reserved_bytes, 0u);
  EXPECT_DOUBLE_EQ(arena.stats().fragmentation(), 0.0);
}

TEST(Arena, BestFitReusesTheSmallestHole) {
  Arena arena("test", 64 * 16);
  void* a = arena.allocate(64 * 4, MemoryCategory::kOther);
  void* sep1 = arena.allocate(64, MemoryCategory::kOther);
  void* b = arena.allocate(64 * 2, MemoryCategory::kOther);
  void* sep2 = arena.allocate(64, MemoryCategory::kOther);
  arena.release(a);
  arena.release(b);
  void* c = arena.allocate(64 * 2, MemoryCategory::kOther);
  EXPECT_EQ(c, b);  // the 2-block hole, not the 4-block one
  arena.release(c);
  arena.release(sep1);
  arena.release(sep2);
}

TEST(Arena, LargeChunksAreWholeHugePagesAdvisedToTheKernel) {
  Arena large("large", 3 << 20);
  void* block = large.allocate(1000, MemoryCategory::kActivations);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % Arena::kHugePageBytes, 0u);
  EXPECT_EQ(large.stats().reserved_bytes, size_t(4) << 20);  // 3 MiB rounded up to 2 huge pages

  Arena small("small", 64 << 10);
  void* small_block = small.allocate(1000, MemoryCategory::kActivations);
  EXPECT_EQ(small.stats().reserved_bytes, size_t(64) << 10);  // below a huge page: as asked

  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage")) {
    large.release(block);
    small.release(small_block);
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  }
  // "hg": the mapping carries MADV_HUGEPAGE.
  EXPECT_NE(mapping_flags(block).find(" hg "), std::string::npos) << mapping_flags(block);
  EXPECT_EQ(mapping_flags(small_block).find(" hg "), std::string::npos)
      << mapping_flags(small_block);
  large.release(block);
  small.release(small_block);
}

}  // namespace
}  // namespace lattice
