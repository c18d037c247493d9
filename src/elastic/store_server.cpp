#include "elastic/store_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace lattice {
namespace {

// Debian's redis-tools ships the server as redis-check-rdb, which serves when its argv[0] names
// redis-server (what the redis-server package's symlink does, without installing a system
// service); a redis-server on the PATH is preferred.
std::string server_binary() {
  for (const char* candidate :
       {"/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/bin/redis-check-rdb"}) {
    if (::access(candidate, X_OK) == 0) return candidate;
  }
  LATTICE_THROW(ConfigError,
                "lattice launch --nnodes needs redis-server for its rendezvous store, and none "
                "is installed ---> HINT: bash scripts/setup.sh (Debian's redis-tools)");
}

std::string tail_of(const std::filesystem::path& log) {
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  if (s.size() > 600) s = s.substr(s.size() - 600);
  return s;
}

}  // namespace

StoreServer::StoreServer(const StoreAddress& address, const std::string& secret,
                         const std::filesystem::path& dir, std::chrono::milliseconds timeout)
    : address_(address), log_(dir / "store.log") {
  const std::filesystem::path config = dir / "store.conf";
  {
    const int fd = ::open(config.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      LATTICE_THROW(IoError, "cannot write {}: {}", config.string(), std::strerror(errno));
    }
    // The secret stays out of the command line, which every user of the machine can read.
    const std::string text = fmt::format(
        "bind {}\nport {}\nrequirepass {}\nsave \"\"\nappendonly no\ndaemonize no\n"
        "dir {}\nlogfile {}\nprotected-mode yes\nacllog-max-len 128\n",
        address.host, address.port, secret, dir.string(), log_.string());
    const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
    ::close(fd);
    if (!ok) LATTICE_THROW(IoError, "cannot write {}", config.string());
  }
  const std::string binary = server_binary();
  std::string name = "redis-server";
  std::string config_arg = config.string();
  std::vector<char*> argv = {name.data(), config_arg.data(), nullptr};
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) LATTICE_THROW(IoError, "cannot start redis-server: {}", std::strerror(errno));
  if (pid_ == 0) {
    // Only async-signal-safe calls between fork and exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      LATTICE_THROW(ConfigError,
                    "cannot serve the rendezvous store on {}: redis-server ended: {} ---> HINT: "
                    "--rdzv must name an address of this machine (agent 0's) and a free port",
                    address.text(), tail_of(log_));
    }
    try {
      RedisStore::connect(address, secret, std::chrono::milliseconds(200));
      return;
    } catch (const CommError&) {
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      this->~StoreServer();  // a constructor that throws runs no destructor
      pid_ = -1;
      LATTICE_THROW(ConfigError, "the rendezvous store on {} did not start within {} ms: {}",
                    address.text(), timeout.count(), tail_of(log_));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

StoreServer::~StoreServer() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace lattice
