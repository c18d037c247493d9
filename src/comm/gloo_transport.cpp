#include "comm/gloo_transport.h"

#include <fmt/ranges.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <filesystem>
#include <iterator>
#include <optional>
#include <thread>
#include <vector>

#include "comm/hash_mix.h"
#include "comm/redis_store.h"
#include "comm/reduce_kernels.h"

namespace lattice {
namespace {

using std::chrono::milliseconds;
using UnboundBuffer = gloo::transport::UnboundBuffer;

// Gloo wants a pointer even for an empty message; it reads and writes none of it.
std::byte g_empty[8];

// What is left of `deadline`, for Gloo's waits. Zero means "check once" there (only -1 means
// "the context's default"); a day bounds it so that Gloo's now() + timeout cannot overflow.
milliseconds time_left(Deadline deadline) {
  const auto left = deadline - CommClock::now();
  if (left <= CommClock::duration::zero()) return milliseconds(0);
  return std::min(std::chrono::ceil<milliseconds>(left), milliseconds(std::chrono::hours(24)));
}

// A write to a peer that died must come back as EPIPE, which Gloo reports, rather than SIGPIPE
// killing the process. A handler somebody else installed is left alone.
void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) == 0 &&
        current.sa_handler == SIG_DFL) {
      std::signal(SIGPIPE, SIG_IGN);
    }
  });
}

// Gloo's FileStore with waits of millisecond resolution: its own wait compares whole elapsed
// seconds against the timeout, so a 300 ms rendezvous deadline would be a 1 s one.
class FileStore : public gloo::rendezvous::FileStore {
 public:
  using gloo::rendezvous::FileStore::FileStore;
  using gloo::rendezvous::FileStore::wait;
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!check(keys)) {
      if (timeout != gloo::kNoTimeout && std::chrono::steady_clock::now() >= end) {
        GLOO_THROW_IO_EXCEPTION("Wait timeout for key(s): ", ::gloo::MakeString(keys));
      }
      std::this_thread::sleep_for(milliseconds(2));
    }
  }
};

// The rendezvous store as connectFullMesh sees it: every wait (and get, which waits) ends at one
// deadline. Gloo's own get() waits the store's 30 s default, whatever the context's timeout.
class DeadlineStore : public gloo::rendezvous::Store {
 public:
  DeadlineStore(gloo::rendezvous::Store& inner, Deadline deadline,
                std::function<bool()> abandon = {})
      : inner_(inner), deadline_(deadline), abandon_(std::move(abandon)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    // Never zero: a zero timeout means "wait forever" to Gloo's stores.
    milliseconds left = std::max(time_left(deadline_), milliseconds(1));
    if (timeout != gloo::kNoTimeout) left = std::min(left, timeout);
    if (!abandon_) return inner_.wait(keys, left);
    // In slices, asking between them whether the rendezvous is still wanted.
    const auto end = CommClock::now() + left;
    for (;;) {
      const milliseconds slice = std::min(std::max(time_left(end), milliseconds(1)), kSlice);
      try {
        inner_.wait(keys, slice);
        return;
      } catch (const gloo::IoException&) {
        if (CommClock::now() >= end) throw;
      }
      if (abandon_()) {
        LATTICE_THROW(CommError, "the gloo rendezvous was abandoned while waiting for {}",
                      ::gloo::MakeString(keys));
      }
    }
  }
  // Whether `key` is set now (waits a millisecond at most).
  bool has(const std::string& key) {
    try {
      inner_.wait({key}, milliseconds(1));
      return true;
    } catch (const gloo::IoException&) {
      return false;
    }
  }

 private:
  static constexpr milliseconds kSlice{20};
  gloo::rendezvous::Store& inner_;
  Deadline deadline_;
  std::function<bool()> abandon_;
};

// Gloo's TCP device resolves the bind address itself but reads an uninitialised result when the
// lookup fails (it only checks for -1, getaddrinfo's errors are other negative codes), so a name
// that does not resolve is refused here first.
void check_resolves(const std::string& hostname) {
  if (hostname.empty()) return;  // Gloo uses this machine's hostname
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rv = getaddrinfo(hostname.c_str(), nullptr, &hints, &result);
  if (rv != 0) {
    LATTICE_THROW(ConfigError,
                  "gloo transport: the bind address '{}' does not resolve: {} ---> HINT: set "
                  "LATTICE_BIND_ADDR (lattice launch) to an address of this host that the "
                  "other ranks can reach",
                  hostname, gai_strerror(rv));
  }
  freeaddrinfo(result);
}

std::string arrival_key(int rank) {
  return fmt::format("lattice/arrived/{}", rank);
}

std::string describe_store(const GlooOptions& options) {
  const std::string where =
      options.store_path.empty() ? "the given store" : fmt::format("'{}'", options.store_path);
  return options.prefix.empty() ? where : fmt::format("{} (prefix '{}')", where, options.prefix);
}

// Every rank announces itself with its world size, then waits for all the others: a rank that
// never comes is named here, before Gloo's connectFullMesh would wait on it anonymously.
void meet(DeadlineStore& store, const GlooOptions& options) {
  const std::string size_text = std::to_string(options.size);
  try {
    store.set(arrival_key(options.rank), std::vector<char>(size_text.begin(), size_text.end()));
  } catch (const gloo::EnforceNotMet& e) {
    LATTICE_THROW(ConfigError,
                  "gloo rendezvous in {}: rank {} has already arrived ({}) ---> HINT: two "
                  "processes were given rank {}, or the store holds an earlier world's keys "
                  "under the same prefix; every generation needs its own prefix (lattice "
                  "launch: LATTICE_GENERATION)",
                  describe_store(options), options.rank, e.what(), options.rank);
  }
  std::vector<std::string> others;
  for (int r = 0; r < options.size; ++r) {
    if (r != options.rank) others.push_back(arrival_key(r));
  }
  if (others.empty()) return;
  try {
    store.wait(others);
  } catch (const gloo::IoException&) {
    std::vector<int> missing;
    for (int r = 0; r < options.size; ++r) {
      if (r != options.rank && !store.has(arrival_key(r))) missing.push_back(r);
    }
    if (!missing.empty()) {
      LATTICE_THROW(CommError,
                    "gloo rendezvous in {}: rank {} of {} waited {} ms, but ranks {} never "
                    "arrived ---> HINT: start all {} ranks on the same store and generation "
                    "(`lattice launch --nproc-per-node N` does); a rank that failed at startup "
                    "says why in its log",
                    describe_store(options), options.rank, options.size, options.timeout.count(),
                    missing, options.size);
    }
  }
  for (int r = 0; r < options.size; ++r) {
    if (r == options.rank) continue;
    const std::vector<char> value = store.get(arrival_key(r));
    const std::string theirs(value.begin(), value.end());
    if (theirs != size_text) {
      LATTICE_THROW(ConfigError,
                    "gloo rendezvous in {}: rank {} joined a world of {} ranks, but rank {} "
                    "expects {} ---> HINT: every rank must be started with the same "
                    "LATTICE_WORLD_SIZE",
                    describe_store(options), r, theirs, options.rank, options.size);
    }
  }
}

}  // namespace

class GlooPendingSend : public PendingSend {
 public:
  GlooPendingSend(std::shared_ptr<GlooTransport> transport, std::unique_ptr<UnboundBuffer> buffer,
                  int peer, size_t bytes)
      : transport_(std::move(transport)), buffer_(std::move(buffer)), peer_(peer), bytes_(bytes) {}

  // Gloo cannot withdraw a posted send and would read the caller's buffer after this returns.
  // A zero-timeout wait either finds the send complete or, as Gloo does on every missed
  // timeout, fails all operations and closes every connection; Gloo then touches no buffer.
  ~GlooPendingSend() override {
    if (!buffer_) return;
    try {
      if (buffer_->waitSend(nullptr, milliseconds(0))) {
        transport_->retire(std::move(buffer_));
        return;
      }
    } catch (...) {
    }
    try {
      transport_->record_failure(
          fmt::format("a send to rank {} was abandoned before rank {} took it", peer_, peer_));
    } catch (...) {
    }
  }

  void wait(Deadline deadline) override {
    if (!buffer_) return;
    bool done = false;
    try {
      done = buffer_->waitSend(nullptr, time_left(deadline));
    } catch (const std::exception& e) {
      buffer_.reset();  // the connections are closed: Gloo has let go of it
      transport_->fail(peer_, "send", bytes_, e, deadline);
    }
    // false only after abortWaitSend(), which this transport never calls.
    LATTICE_CHECK(done, "gloo aborted a send to rank {}", peer_);
    transport_->retire(std::move(buffer_));
  }

 private:
  std::shared_ptr<GlooTransport> transport_;
  std::unique_ptr<UnboundBuffer> buffer_;
  int peer_;
  size_t bytes_;
};

std::shared_ptr<GlooTransport> GlooTransport::create(const GlooOptions& options) {
  if (is_redis_store(options.store_path)) {
    const std::unique_ptr<RedisStore> store = RedisStore::connect(
        parse_store_address(options.store_path), options.secret, options.timeout);
    return create(*store, options);
  }
  std::error_code ec;
  if (options.store_path.empty() || !std::filesystem::is_directory(options.store_path, ec)) {
    LATTICE_THROW(ConfigError,
                  "the gloo rendezvous store '{}' is not a directory ---> HINT: `lattice launch` "
                  "creates one and passes it as LATTICE_STORE; every rank must see the same "
                  "directory (on several nodes, a shared filesystem)",
                  options.store_path);
  }
  FileStore store(options.store_path);
  return create(store, options);
}

std::shared_ptr<GlooTransport> GlooTransport::create(gloo::rendezvous::Store& store,
                                                     const GlooOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    LATTICE_THROW(ConfigError, "gloo transport: rank {} of a world of {} ranks is not a rank",
                  options.rank, options.size);
  }
  LATTICE_CHECK_GT(options.timeout.count(), 0, "gloo rendezvous timeout");
  ignore_sigpipe();
  const Deadline deadline = CommClock::now() + options.timeout;
  std::optional<gloo::rendezvous::PrefixStore> prefixed;
  if (!options.prefix.empty()) prefixed.emplace(options.prefix, store);
  DeadlineStore bounded(prefixed ? *prefixed : store, deadline, options.abandon);
  meet(bounded, options);

  check_resolves(options.hostname);
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    LATTICE_THROW(ConfigError,
                  "gloo transport: cannot bind a TCP device to '{}': {} ---> HINT: set "
                  "LATTICE_BIND_ADDR (lattice launch) to an address of this host that the "
                  "other ranks can reach",
                  options.hostname, e.what());
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
  context->setTimeout(options.timeout);
  try {
    context->connectFullMesh(bounded, device);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    LATTICE_THROW(CommError,
                  "gloo rendezvous in {}: rank {} of {} could not connect to every other rank "
                  "within {} ms: {} ---> HINT: a rank that left after arriving says why in its "
                  "log; ranks on other hosts need a LATTICE_BIND_ADDR they can reach",
                  describe_store(options), options.rank, options.size, options.timeout.count(),
                  e.what());
  }
  std::shared_ptr<GlooTransport> transport(
      new GlooTransport(options.rank, options.size, std::move(context)));
  if (!options.secret.empty()) transport->authenticate(options.secret, options.prefix, deadline);
  return transport;
}

namespace {

using Digest = std::array<unsigned char, 32>;

// What rank `answering` proves to rank `asking` about the challenge `challenge`: bound to the
// generation's prefix and to both ranks, so an answer cannot be replayed on another pair.
Digest answer_for(const std::string& secret, const std::string& prefix, int answering, int asking,
                  const Digest& challenge) {
  std::string message = fmt::format("lattice-mesh|{}|{}|{}|", prefix, answering, asking);
  message.append(reinterpret_cast<const char*>(challenge.data()), challenge.size());
  Digest digest{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret.data(), int(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest.data(),
       &length);
  LATTICE_CHECK_EQ(size_t(length), digest.size(), "HMAC-SHA256 length");
  return digest;
}

// The messages of the handshake, apart from every Communicator's (whose contexts are hashes).
constexpr uint64_t kAuthContext = 0x4c41545441555448ull;  // "LATTAUTH"

}  // namespace

void GlooTransport::authenticate(const std::string& secret, const std::string& prefix,
                                 Deadline deadline) {
  const size_t n = size_t(size_);
  std::vector<Digest> challenges(n), theirs(n), answers(n);
  std::vector<PendingSendPtr> sends;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    LATTICE_CHECK_EQ(RAND_bytes(challenges[size_t(p)].data(), int(Digest().size())), 1,
                     "RAND_bytes");
    sends.push_back(post_send(p, {kAuthContext, 1}, challenges[size_t(p)].data(), sizeof(Digest)));
  }
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    recv(p, {kAuthContext, 1}, theirs[size_t(p)].data(), sizeof(Digest), deadline);
    answers[size_t(p)] = answer_for(secret, prefix, rank_, p, theirs[size_t(p)]);
    sends.push_back(post_send(p, {kAuthContext, 2}, answers[size_t(p)].data(), sizeof(Digest)));
  }
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Digest answer{};
    recv(p, {kAuthContext, 2}, answer.data(), sizeof(Digest), deadline);
    const Digest expected = answer_for(secret, prefix, p, rank_, challenges[size_t(p)]);
    if (CRYPTO_memcmp(answer.data(), expected.data(), answer.size()) != 0) {
      const std::string what = fmt::format(
          "the connection that claims to be rank {} did not prove it holds the "
          "job's secret: refused",
          p);
      spdlog::error("gloo transport, rank {}: {}", rank_, what);
      record_failure(what);
      // Close every connection (see fail()): nothing more is read from or sent to it.
      try {
        context_->createUnboundBuffer(g_empty, 0)->waitRecv(nullptr, milliseconds(0));
      } catch (const std::exception&) {
      }
      sends.clear();
      LATTICE_THROW(CommError,
                    "gloo transport, rank {}: {} ---> HINT: every rank of a job must be started "
                    "by its agents with the job's secret (lattice launch --secret-file); a "
                    "process that is not part of the job may be connecting to this host's ports",
                    rank_, what);
    }
  }
  for (PendingSendPtr& send : sends) send->wait(deadline);
}

GlooTransport::GlooTransport(int rank, int size, std::shared_ptr<gloo::Context> context)
    : rank_(rank), size_(size), context_(std::move(context)) {}

GlooTransport::~GlooTransport() = default;

uint64_t GlooTransport::slot(MessageKey key, size_t bytes) {
  return hash_mix(hash_mix(hash_mix(0x474c4f4f534c4f54ull /* "GLOOSLOT" */, key.context), key.tag),
                  uint64_t(bytes));
}

void GlooTransport::check_peer(int peer, const char* what) const {
  LATTICE_CHECK(peer >= 0 && peer < size_ && peer != rank_, "gloo: {} rank {} on rank {} of {}",
                what, peer, rank_, size_);
}

PendingSendPtr GlooTransport::post_send(int peer, MessageKey key, const void* data, size_t bytes) {
  check_peer(peer, "send to");
  // Gloo's buffers are not const-qualified; a send only reads through the pointer.
  auto buffer = context_->createUnboundBuffer(bytes > 0 ? const_cast<void*>(data) : g_empty, bytes);
  try {
    buffer->send(peer, slot(key, bytes), 0, bytes);
  } catch (const std::exception& e) {
    fail(peer, "send", bytes, e, Deadline::max());
  }
  return std::make_unique<GlooPendingSend>(shared_from_this(), std::move(buffer), peer, bytes);
}

void GlooTransport::recv(int peer, MessageKey key, void* data, size_t bytes, Deadline deadline) {
  check_peer(peer, "receive from");
  auto buffer = context_->createUnboundBuffer(bytes > 0 ? data : g_empty, bytes);
  bool done = false;
  try {
    buffer->recv(peer, slot(key, bytes), 0, bytes);
    done = buffer->waitRecv(nullptr, time_left(deadline));
  } catch (const std::exception& e) {
    fail(peer, "recv", bytes, e, deadline);
  }
  // false only after abortWaitRecv(), which this transport never calls.
  LATTICE_CHECK(done, "gloo aborted a recv from rank {}", peer);
  retire(std::move(buffer));
}

void GlooTransport::retire(std::unique_ptr<UnboundBuffer> buffer) {
  // Two batches: the older one is destroyed when the newer fills, long after its I/O completed.
  constexpr size_t kBatch = 32;
  std::vector<std::unique_ptr<UnboundBuffer>> old;
  {
    std::lock_guard lock(retired_mutex_);
    retired_.push_back(std::move(buffer));
    if (retired_.size() < 2 * kBatch) return;
    old.assign(std::make_move_iterator(retired_.begin()),
               std::make_move_iterator(retired_.begin() + kBatch));
    retired_.erase(retired_.begin(), retired_.begin() + kBatch);
  }
}  // `old` is destroyed here, outside the lock

void GlooTransport::record_failure(const std::string& what) {
  std::function<void()> listener;
  {
    std::lock_guard lock(failure_mutex_);
    if (!failure_.empty()) return;
    failure_ = what;
    listener = std::move(failure_listener_);
  }
  if (listener) listener();
}

void GlooTransport::on_failure(std::function<void()> listener) {
  std::lock_guard lock(failure_mutex_);
  failure_listener_ = std::move(listener);
}

void GlooTransport::abort(const std::string& why) {
  record_failure(why);
  try {
    context_->createUnboundBuffer(g_empty, 0)->waitRecv(nullptr, milliseconds(0));
  } catch (const std::exception&) {
  }
}

std::string GlooTransport::first_failure() const {
  std::lock_guard lock(failure_mutex_);
  return failure_;
}

void GlooTransport::fail(int peer, const char* what, size_t bytes, const std::exception& e,
                         Deadline deadline) {
  std::string earlier = first_failure();
  // Gloo's words for "another call on this context missed its deadline", which can arrive here
  // before that call has recorded its failure.
  if (earlier.empty() &&
      std::string_view(e.what()).find("Application timeout") != std::string_view::npos) {
    earlier = "another call on this rank missed its deadline";
  }
  const bool timed_out = CommClock::now() >= deadline;
  record_failure(timed_out ? fmt::format("a {} with rank {} missed its deadline", what, peer)
                           : fmt::format("a {} with rank {} failed: {}", what, peer, e.what()));
  // Fail everything else now, so that this rank's other thread and the peers waiting on this
  // rank learn of it at once instead of at their deadlines. Gloo's one way to fail every pending
  // operation of a context and close its connections is its reaction to a missed timeout
  // (already under way if this was one), which a zero-timeout wait on an idle buffer triggers.
  try {
    context_->createUnboundBuffer(g_empty, 0)->waitRecv(nullptr, milliseconds(0));
  } catch (const std::exception&) {
  }
  if (timed_out) {
    throw PeerTimeout(peer, std::string_view(what) == "recv"
                                ? fmt::format("rank {} did not send {} bytes (on gloo, a send of "
                                              "another size never matches)",
                                              peer, bytes)
                                : fmt::format("rank {} did not receive {} bytes", peer, bytes));
  }
  if (!earlier.empty()) {
    LATTICE_THROW(CommError,
                  "gloo transport, rank {}: a {} of {} bytes with rank {} failed because this "
                  "transport had failed before ({}): {} ---> HINT: Gloo cannot cancel an "
                  "operation, so after a timeout or a lost peer every connection is closed and "
                  "the world must be rebuilt (under `lattice launch`, by the next generation)",
                  rank_, what, bytes, peer, earlier, e.what());
  }
  LATTICE_THROW(CommError,
                "gloo transport, rank {}: the connection to rank {} failed during a {} of {} "
                "bytes: {} ---> HINT: rank {} closed its side: its process exited or crashed, or "
                "it gave up on a call of its own (a failure closes all of a rank's "
                "connections); its log says which. Gloo cannot cancel an operation, so the "
                "world must be rebuilt (under `lattice launch`, by the next generation)",
                rank_, peer, what, bytes, e.what(), peer);
}

}  // namespace lattice
