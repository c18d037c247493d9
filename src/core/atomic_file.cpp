#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

namespace lattice {

namespace {

// Unique per process and per writer, so concurrent writers (threads or ranks) never share a
// temporary file even when they target the same path.
std::filesystem::path temp_sibling(const std::filesystem::path& target) {
  static std::atomic<uint64_t> counter{0};
  std::string name =
      fmt::format("{}.tmp.{}.{}", target.filename().string(), ::getpid(), counter.fetch_add(1));
  return target.parent_path() / name;
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::filesystem::path target, const std::filesystem::path& reuse)
    : target_(std::move(target)), temp_(temp_sibling(target_)) {
  if (target_.filename().empty()) {
    LATTICE_THROW(IoError, "cannot write '{}': the path names a directory, not a file",
                  target_.string());
  }
  if (!reuse.empty() && ::rename(reuse.c_str(), temp_.c_str()) == 0) {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CLOEXEC);
    reused_ = fd_ >= 0;
    if (fd_ < 0) ::unlink(temp_.c_str());
  }
  if (fd_ < 0) fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    LATTICE_THROW(IoError,
                  "cannot create '{}' (temporary for '{}'): {} ---> HINT: check that "
                  "the directory exists and is writable",
                  temp_.string(), target_.string(), std::strerror(errno));
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFileWriter::write(std::span<const std::byte> bytes) {
  LATTICE_CHECK(!committed_, "write to '{}' after commit", target_.string());
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      LATTICE_THROW(IoError, "cannot write '{}': {}", temp_.string(), std::strerror(errno));
    }
    p += n;
    left -= size_t(n);
    written_ += uint64_t(n);
  }
}

void AtomicFileWriter::commit() {
  LATTICE_CHECK(!committed_, "'{}' committed twice", target_.string());
  if (reused_ && ::ftruncate(fd_, off_t(written_)) != 0) {
    LATTICE_THROW(IoError, "cannot cut '{}' to {} bytes: {}", temp_.string(), written_,
                  std::strerror(errno));
  }
  if (::fsync(fd_) != 0) {
    LATTICE_THROW(IoError, "cannot flush '{}' to disk: {}", temp_.string(), std::strerror(errno));
  }
  int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) {
    LATTICE_THROW(IoError, "cannot close '{}': {}", temp_.string(), std::strerror(errno));
  }
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    LATTICE_THROW(IoError, "cannot rename '{}' to '{}': {}", temp_.string(), target_.string(),
                  std::strerror(errno));
  }
  committed_ = true;
  // Persist the directory entry too; without it a crash could forget the rename.
  std::filesystem::path dir = target_.parent_path().empty() ? "." : target_.parent_path();
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  AtomicFileWriter writer(path);
  writer.write(text.data(), text.size());
  writer.commit();
}

}  // namespace lattice
