// Replacing a file atomically: the bytes go to a temporary sibling, which is flushed to disk
// and renamed over the target only on commit(). Readers see the old file or the complete new
// one, never a partial write, so a crash mid-save loses nothing (DESIGN.md invariant 5).
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>

namespace lattice {

class AtomicFileWriter {
 public:
  // Creates the temporary file next to `target` (same directory, so rename is atomic).
  // Throws IoError if the directory does not exist or is not writable. `reuse`, when that file
  // exists: it becomes the temporary file and is written over instead (on tmpfs its pages are
  // already allocated, and writing over them costs less than half of a new file's).
  explicit AtomicFileWriter(std::filesystem::path target, const std::filesystem::path& reuse = {});
  // Removes the temporary file if commit() was not reached (e.g. an exception mid-write).
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(std::span<const std::byte> bytes);
  void write(const void* data, size_t size) {
    write(std::span<const std::byte>(static_cast<const std::byte*>(data), size));
  }
  // fsync the data, rename over the target, fsync the directory so the rename is durable.
  void commit();

  const std::filesystem::path& target() const { return target_; }
  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
  bool reused_ = false;  // written over an old file: cut to what was written at commit
  uint64_t written_ = 0;
};

// `text` as the whole of `path`, through an AtomicFileWriter.
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

}  // namespace lattice
