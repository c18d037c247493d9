// The `gloo` transport: one rank per process (started by `lattice launch`), on the point-to-point
// half of Gloo's TCP transport: unbound buffers, matched per (peer, slot) in posting order, which
// is the (source, MessageKey) order the Transport contract asks for. Gloo's own collectives are
// not used (no Algorithm::kNative); Lattice's ring / hd / tree run on top, as on the other
// transports.
//
// Rendezvous: the ranks meet in a gloo::rendezvous::Store (a FileStore directory under `lattice
// launch`) under a per-generation key prefix, so a restarted world never meets an old one's keys;
// every rank first announces itself, so a rank that never comes is named in the error, then
// Gloo connects the full mesh of TCP pairs.
//
// Slots: a message's Gloo slot is a 64-bit hash of (context, tag, byte count) (slot() below).
// The byte count is in it because Gloo cannot report a size mismatch: a message larger than the
// posted receive aborts the process from Gloo's I/O thread, a smaller one completes short
// without a word. With the size in the slot, ranks that disagree on a count or dtype simply do
// not match, and the call times out.
//
// Failures are final, as everywhere in Gloo: an operation cannot be cancelled, so a missed
// deadline closes every connection of the transport (Gloo's own reaction to a timeout), and a
// lost peer fails every call that involves it at once (its socket closes) rather than at the
// deadline. After either, every call on the transport throws CommError quoting the first failure;
// the world must be rebuilt (under `lattice launch`, by the next generation). Likewise a
// PendingSend destroyed before its wait() returned (an exception unwinding a collective) closes
// the connections: Gloo keeps reading the sender's buffer until the receiver took it, and that
// memory is the caller's to free once the handle is gone.
//
// Calls come from two threads of a rank (the compute thread and the gradient comm thread), as on
// mpi: Gloo's pairs lock internally, and recv_reduce stages per calling thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/transport.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}  // namespace rendezvous
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace lattice {

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // The store the ranks share (LATTICE_STORE): a gloo::rendezvous::FileStore directory, or
  // "redis://HOST:PORT", the store agent 0 of a multi-node `lattice launch` serves.
  std::string store_path;
  // The job's secret (LATTICE_JOB_SECRET). Non-empty: the Redis store is opened with it, and
  // every connection of the mesh must prove it holds it before create() returns (authenticate
  // below); a peer that cannot is refused, logged and named in a CommError.
  std::string secret;
  // Key prefix, one per generation of an elastic job ("gen3/"), so that a restarted world never
  // meets an old one's keys.
  std::string prefix;
  // The address the TCP device binds to and advertises to the peers (LATTICE_BIND_ADDR).
  std::string hostname = "127.0.0.1";
  // Rendezvous deadline (every rank must arrive and connect within it) and Gloo's default
  // operation timeout. Calls through a Communicator pass their own deadlines.
  std::chrono::milliseconds timeout{30000};
  // Polled while the rendezvous waits: true gives it up with a CommError (an elastic rank whose
  // generation the agent replaced before every rank had arrived).
  std::function<bool()> abandon = {};
};

class GlooTransport : public Transport, public std::enable_shared_from_this<GlooTransport> {
 public:
  // Meets the other ranks in the FileStore at options.store_path and connects the full mesh.
  // ConfigError when the store is not a directory, the bind address is unusable or two ranks
  // claim one rank; CommError naming the store and the missing ranks when some rank does not
  // arrive within options.timeout.
  static std::shared_ptr<GlooTransport> create(const GlooOptions& options);
  // The same on a store of the caller's (tests: an in-process gloo::rendezvous::HashStore);
  // options.store_path only names it in errors.
  static std::shared_ptr<GlooTransport> create(gloo::rendezvous::Store& store,
                                               const GlooOptions& options);
  // Closes the connections: peers waiting on this rank fail at once.
  ~GlooTransport() override;
  GlooTransport(const GlooTransport&) = delete;
  GlooTransport& operator=(const GlooTransport&) = delete;

  TransportKind kind() const override { return TransportKind::kGloo; }
  int world_rank() const override { return rank_; }
  int world_size() const override { return size_; }

  PendingSendPtr post_send(int peer, MessageKey key, const void* data, size_t bytes) override;
  void recv(int peer, MessageKey key, void* data, size_t bytes, Deadline deadline) override;

  // The Gloo slot of a message of `bytes` bytes with `key`: splitmix64 steps over (context, tag,
  // bytes). Deterministic, so both sides compute it alone; two keys in flight at once collide
  // with probability about 2^-64.
  static uint64_t slot(MessageKey key, size_t bytes);

  // Fails every call now and later and closes the connections (peers fail at once).
  void abort(const std::string& why);
  // Called once, on the thread that found it, when this transport first fails.
  void on_failure(std::function<void()> listener);

 private:
  // Gloo's TCP pairs admit any process that connects first. So each rank sends every peer a
  // fresh random challenge, answers each peer's with HMAC-SHA256(secret, prefix, both ranks,
  // challenge), and checks the answers to its own, before a byte of training data moves.
  void authenticate(const std::string& secret, const std::string& prefix, Deadline deadline);
  friend class GlooPendingSend;
  GlooTransport(int rank, int size, std::shared_ptr<gloo::Context> context);
  void check_peer(int peer, const char* what) const;
  // Turns a Gloo exception of a call with `peer` into PeerTimeout (the deadline passed) or
  // CommError (the connection failed, now or earlier), and records the first failure.
  [[noreturn]] void fail(int peer, const char* what, size_t bytes, const std::exception& e,
                         Deadline deadline);
  void record_failure(const std::string& what);
  std::string first_failure() const;
  // Keeps a completed buffer for a while before destroying it. ~UnboundBuffer spins (yielding)
  // until Gloo's I/O thread drops the reference it holds while it wakes the waiter; destroyed at
  // once, on busy cores that spin often lasted a scheduler tick (4 ms per message, measured).
  void retire(std::unique_ptr<gloo::transport::UnboundBuffer> buffer);

  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<gloo::Context> context_;
  mutable std::mutex failure_mutex_;
  std::string failure_;  // the first failure, quoted by every later error
  std::function<void()> failure_listener_;
  std::mutex retired_mutex_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> retired_;
};

}  // namespace lattice
