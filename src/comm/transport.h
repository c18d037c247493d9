// A transport moves bytes between world ranks; every algorithm in comm/ is written against it.
//
// Messages are matched by (source rank, MessageKey). A send is posted (non-blocking) and then
// waited for; the sender keeps its buffer unchanged until the wait returns, which lets the
// threads transport hand the receiver a pointer instead of copying into a staging buffer.
// Every blocking call takes a deadline and throws PeerTimeout when it passes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "comm/comm_types.h"
#include "core/dtype.h"
#include "core/error.h"

namespace lattice {

struct MessageKey {
  uint64_t context = 0;  // the group (Communicator) the message belongs to
  uint64_t tag = 0;      // collective call and step within it, or the user's send/recv tag
  bool operator==(const MessageKey&) const = default;
};

// Raised by a transport when a deadline passes; the Communicator rewrites it into the error
// that names the collective, group, sequence number and missing ranks.
class PeerTimeout : public TimeoutError {
 public:
  PeerTimeout(int peer, const std::string& what) : TimeoutError(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

class PendingSend {
 public:
  virtual ~PendingSend() = default;  // a send not yet received is withdrawn
  // Blocks until the receiver has the bytes.
  virtual void wait(Deadline deadline) = 0;
};
using PendingSendPtr = std::unique_ptr<PendingSend>;

// A collective call handed to the MPI library (Algorithm::kNative). Buffers follow MPI:
// all_reduce and broadcast work in place on `recv`; `count` is the per-rank count for
// reduce_scatter and all_gather.
struct NativeCall {
  Collective collective = Collective::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;  // group rank
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual TransportKind kind() const = 0;
  virtual int world_rank() const = 0;
  virtual int world_size() const = 0;

  // Called by every member of a new group (ranks in group order) before it is used.
  virtual void create_context(uint64_t context, const std::vector<int>& members) {}

  virtual PendingSendPtr post_send(int peer, MessageKey key, const void* data, size_t bytes) = 0;
  virtual void recv(int peer, MessageKey key, void* data, size_t bytes, Deadline deadline) = 0;
  // Receives `count` elements and folds them into `acc`: acc[i] = op(acc[i], incoming[i]).
  // By default recv() into a staging buffer of the calling thread (a rank's compute thread and
  // its gradient comm thread may both be here at once), then the fold.
  virtual void recv_reduce(int peer, MessageKey key, void* acc, int64_t count, DType dtype,
                           ReduceOp op, Deadline deadline);

  // Arrival board for timeout reports: a rank records that it entered call `seq` of a group;
  // missing_ranks() returns the members (group ranks) that have not entered it, or nullopt
  // when the transport cannot tell.
  virtual void mark_arrival(uint64_t context, uint64_t seq) {}
  virtual std::optional<std::vector<int>> missing_ranks(uint64_t context, uint64_t seq,
                                                        const std::vector<int>& members) {
    return std::nullopt;
  }

  virtual bool has_native() const { return false; }
  virtual void run_native(uint64_t context, const NativeCall& call, Deadline deadline);
};

}  // namespace lattice
