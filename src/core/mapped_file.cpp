#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace lattice {

MappedFile::MappedFile(std::filesystem::path path) : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    LATTICE_THROW(IoError, "cannot open '{}': {}", path_.string(), std::strerror(errno));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    int err = errno;
    ::close(fd);
    LATTICE_THROW(IoError, "cannot stat '{}': {}", path_.string(), std::strerror(err));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    LATTICE_THROW(IoError, "'{}' is not a regular file", path_.string());
  }
  size_ = size_t(info.st_size);
  // mmap of zero bytes fails with EINVAL; an empty file simply has no bytes.
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      LATTICE_THROW(IoError, "cannot map '{}' ({} bytes): {}", path_.string(), size_,
                    std::strerror(err));
    }
    data_ = static_cast<const std::byte*>(mapped);
  }
  // The mapping stays valid after the descriptor is closed.
  ::close(fd);
}

MappedFile::~MappedFile() {
  unmap();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::unmap() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace lattice
