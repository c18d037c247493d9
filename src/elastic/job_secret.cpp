#include "elastic/job_secret.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"

namespace lattice {

std::string make_job_secret() {
  std::array<unsigned char, 32> bytes{};
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    LATTICE_CHECK(n > 0, "getrandom failed: {}", std::strerror(errno));
    got += size_t(n);
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

std::optional<std::string> read_job_secret(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    LATTICE_THROW(IoError, "cannot read the job secret {}: {}", path.string(),
                  std::strerror(errno));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    LATTICE_THROW(ConfigError,
                  "the job secret {} may be read by others (mode {:o}) ---> HINT: chmod 600 {}; "
                  "whoever reads it can join the job",
                  path.string(), st.st_mode & 0777, path.string());
  }
  std::ifstream in(path);
  std::string secret;
  in >> secret;
  if (secret.size() < 32) {
    LATTICE_THROW(ConfigError,
                  "the job secret {} holds no secret (at least 32 characters) ---> HINT: remove "
                  "it and let agent 0 (--node-rank 0) write a new one",
                  path.string());
  }
  return secret;
}

void write_job_secret(const std::filesystem::path& path, const std::string& secret) {
  // Written whole under another name, then linked into place: an agent polling for the file
  // never reads it empty or half written, and an existing one is never replaced.
  const std::filesystem::path temp = path.string() + fmt::format(".tmp.{}", ::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    LATTICE_THROW(IoError, "cannot create the job secret {}: {}", temp.string(),
                  std::strerror(errno));
  }
  const std::string text = secret + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  const int linked = ok ? ::link(temp.c_str(), path.c_str()) : -1;
  const int error = errno;
  ::unlink(temp.c_str());
  if (!ok) LATTICE_THROW(IoError, "cannot write the job secret {}", temp.string());
  if (linked != 0) {
    LATTICE_THROW(IoError, "cannot create the job secret {}: {}", path.string(),
                  std::strerror(error));
  }
}

}  // namespace lattice
