#include "comm/redis_store.h"

#include <fmt/format.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include <charconv>
#include <thread>

#include "core/error.h"

namespace lattice {
namespace {

using std::chrono::milliseconds;

timeval to_timeval(milliseconds ms) {
  return timeval{.tv_sec = time_t(ms.count() / 1000),
                 .tv_usec = suseconds_t(ms.count() % 1000 * 1000)};
}

// Every call's own deadline: a server that stopped answering (agent 0's machine lost) fails the
// call instead of hanging its caller.
constexpr milliseconds kCallTimeout{5000};

}  // namespace

std::string StoreAddress::text() const {
  return fmt::format("redis://{}:{}", host, port);
}

bool is_redis_store(const std::string& text) {
  return text.starts_with("redis://");
}

StoreAddress parse_store_address(const std::string& text) {
  std::string rest = is_redis_store(text) ? text.substr(8) : text;
  const size_t colon = rest.rfind(':');
  StoreAddress address;
  if (colon != std::string::npos && colon > 0) {
    address.host = rest.substr(0, colon);
    const std::string port = rest.substr(colon + 1);
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), address.port);
    if (ec == std::errc() && end == port.data() + port.size() && address.port > 0 &&
        address.port < 65536) {
      return address;
    }
  }
  LATTICE_THROW(ConfigError,
                "the rendezvous address '{}' is not HOST:PORT ---> HINT: --rdzv names agent 0's "
                "machine and a free port on it, e.g. --rdzv 10.0.0.1:29400",
                text);
}

RedisStore::RedisStore(const StoreAddress& address, milliseconds call_timeout)
    : gloo::rendezvous::RedisStore(address.host, address.port), address_(address) {
  if (redisSetTimeout(redis_, to_timeval(call_timeout)) != REDIS_OK) {
    LATTICE_THROW(CommError, "the rendezvous store {}: cannot set a timeout on its socket",
                  address_.text());
  }
}

std::unique_ptr<RedisStore> RedisStore::connect(const StoreAddress& address,
                                                const std::string& secret, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error;
  for (;;) {
    std::unique_ptr<RedisStore> store;
    try {
      store.reset(new RedisStore(address, kCallTimeout));
    } catch (const gloo::IoException& e) {
      last_error = e.what();
    }
    if (store) {
      const auto reply =
          std::shared_ptr<redisReply>(static_cast<redisReply*>(redisCommand(
                                          store->redis_, "AUTH %b", secret.data(), secret.size())),
                                      freeReplyObject);
      if (reply && reply->type == REDIS_REPLY_STATUS) return store;
      if (reply && reply->type == REDIS_REPLY_ERROR) {
        LATTICE_THROW(ConfigError,
                      "the rendezvous store {} refused this process: {} ---> HINT: every agent "
                      "of a job needs agent 0's secret (--secret-file, or LATTICE_JOB_SECRET)",
                      address.text(), std::string(reply->str, reply->len));
      }
      last_error = store->redis_->errstr;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      LATTICE_THROW(CommError,
                    "the rendezvous store {} did not answer within {} ms: {} ---> HINT: start "
                    "agent 0 (--node-rank 0), which serves it, with the same --rdzv; check that "
                    "this machine reaches that address and port",
                    address.text(), timeout.count(), last_error);
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
}

std::shared_ptr<redisReply> RedisStore::command(const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  const std::shared_ptr<redisReply> reply(
      static_cast<redisReply*>(
          redisCommandArgv(redis_, int(argv.size()), argv.data(), lengths.data())),
      freeReplyObject);
  if (!reply) {
    LATTICE_THROW(CommError,
                  "the rendezvous store {} failed during {}: {} ---> HINT: agent 0 serves it; "
                  "its machine or process may be gone",
                  address_.text(), args.front(), redis_->errstr);
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    LATTICE_THROW(CommError, "the rendezvous store {} answered {} with an error: {}",
                  address_.text(), args.front(), std::string(reply->str, reply->len));
  }
  return reply;
}

void RedisStore::wait(const std::vector<std::string>& keys, const milliseconds& timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!check(keys)) {
    if (timeout != gloo::kNoTimeout && std::chrono::steady_clock::now() >= end) {
      GLOO_THROW_IO_EXCEPTION("Wait timeout for key(s): ", ::gloo::MakeString(keys));
    }
    std::this_thread::sleep_for(milliseconds(2));
  }
}

void RedisStore::put(const std::string& key, const std::string& value) {
  command({"SET", key, value});
}

std::optional<std::string> RedisStore::try_get(const std::string& key) {
  const auto reply = command({"GET", key});
  if (reply->type != REDIS_REPLY_STRING) return std::nullopt;
  return std::string(reply->str, reply->len);
}

std::vector<std::string> RedisStore::take_refused_clients() {
  const auto reply = command({"ACL", "LOG"});
  std::vector<std::string> refused;
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements == 0) return refused;
  for (size_t e = 0; e < reply->elements; ++e) {
    const redisReply* entry = reply->element[e];
    if (entry->type != REDIS_REPLY_ARRAY) continue;
    std::string reason, client, count = "1";
    for (size_t i = 0; i + 1 < entry->elements; i += 2) {
      const redisReply* key = entry->element[i];
      const redisReply* value = entry->element[i + 1];
      if (key->type != REDIS_REPLY_STRING) continue;
      const std::string name(key->str, key->len);
      if (value->type == REDIS_REPLY_STRING) {
        if (name == "reason") reason.assign(value->str, value->len);
        if (name == "client-info") client.assign(value->str, value->len);
      } else if (value->type == REDIS_REPLY_INTEGER && name == "count") {
        count = std::to_string(value->integer);
      }
    }
    if (reason != "auth") continue;
    // client-info is "id=5 addr=10.0.0.9:41234 laddr=... ": the address is what names it.
    std::string addr = "an unknown address";
    if (const size_t at = client.find("addr="); at != std::string::npos) {
      addr = client.substr(at + 5, client.find(' ', at) - at - 5);
    }
    refused.push_back(fmt::format("{} ({} attempt(s) with a wrong secret)", addr, count));
  }
  command({"ACL", "LOG", "RESET"});
  return refused;
}

}  // namespace lattice
