// A read-only memory map of a whole file, for token files and checkpoint shards: the bytes are
// paged in on demand and shared by every rank of the process instead of being copied into the
// arena (page cache is not arena memory; only the tensors copied out of it are).
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

namespace lattice {

class MappedFile {
 public:
  // Maps `path` read-only. Throws IoError naming the file and the system's reason.
  explicit MappedFile(std::filesystem::path path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const std::filesystem::path& path() const { return path_; }
  size_t size() const { return size_; }
  // All bytes of the file; empty for an empty file.
  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  void unmap() noexcept;

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace lattice
