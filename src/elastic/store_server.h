// The rendezvous store agent 0 of a multi-node `lattice launch` serves: a redis-server child of
// the agent (Debian's redis-tools), bound to the --rdzv address, admitting only clients that
// present the job's secret, keeping nothing on disk. Gloo 0.5 has no TCP store of its own; its
// RedisStore is the one that reaches across machines (comm/redis_store.h). The server dies with
// the agent (PR_SET_PDEATHSIG): a second fault of agent 0 ends the job (docs/elastic.md).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "comm/redis_store.h"

namespace lattice {

class StoreServer {
 public:
  // Starts the server (its config and log in `dir`, mode 0600) and waits until it answers.
  // ConfigError naming the address when it cannot serve there (a port in use, an address not of
  // this machine), with the server's own words.
  StoreServer(const StoreAddress& address, const std::string& secret,
              const std::filesystem::path& dir, std::chrono::milliseconds timeout);
  ~StoreServer();  // kills the server
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  const StoreAddress& address() const { return address_; }

 private:
  StoreAddress address_;
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

}  // namespace lattice
