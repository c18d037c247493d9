// The job's rendezvous store across machines: Gloo's RedisStore on the redis-server that agent 0
// of `lattice launch --nnodes M` serves (elastic/store_server.h), with three things Gloo's lacks:
// the job's secret presented before any other command (AUTH: a client without it is refused),
// a deadline on every call (hiredis's socket timeout; Gloo's RedisStore has none once connected),
// and waits of millisecond resolution (Gloo's compares whole seconds). The agents also keep their
// control plane in it (elastic/agent.h), which needs values they can overwrite and read without
// waiting.
//
//   auto store = RedisStore::connect(parse_store_address("redis://10.0.0.1:29400"), secret, 30s);
#pragma once

#include <gloo/rendezvous/redis_store.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lattice {

struct StoreAddress {
  std::string host;
  int port = 0;
  std::string text() const;  // "redis://host:port"
};

// "redis://HOST:PORT" or "HOST:PORT" (--rdzv); ConfigError naming the form otherwise.
StoreAddress parse_store_address(const std::string& text);
// Whether a LATTICE_STORE value names a Redis store rather than a FileStore directory.
bool is_redis_store(const std::string& text);

class RedisStore : public gloo::rendezvous::RedisStore {
 public:
  // Connects (retrying until `timeout`: agent 0 may not be serving yet) and authenticates.
  // ConfigError when the server refuses the secret; CommError when it cannot be reached.
  static std::unique_ptr<RedisStore> connect(const StoreAddress& address, const std::string& secret,
                                             std::chrono::milliseconds timeout);

  using gloo::rendezvous::RedisStore::wait;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The agents' control plane: a value that may be overwritten, and a read that does not wait.
  void put(const std::string& key, const std::string& value);
  std::optional<std::string> try_get(const std::string& key);
  // The clients the server refused for a wrong secret since the last call (its ACL log), one
  // line each naming the address; the log is cleared.
  std::vector<std::string> take_refused_clients();

  const StoreAddress& address() const { return address_; }

 private:
  RedisStore(const StoreAddress& address, std::chrono::milliseconds call_timeout);
  // One command; CommError naming the server when the connection fails or the reply is an error.
  std::shared_ptr<redisReply> command(const std::vector<std::string>& args);

  StoreAddress address_;
};

}  // namespace lattice
