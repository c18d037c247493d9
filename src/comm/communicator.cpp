#include "comm/communicator.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "core/rank_progress.h"
#include "core/timer.h"

namespace lattice {
namespace {

// An arbitrary constant naming the world group; child groups derive theirs from it.
constexpr uint64_t kWorldContext = 0x4c41545449434531ull;  // "LATTICE1"

// The message size nccl-tests reports for a call (comm_stats.h).
size_t call_bytes(const CallSpec& call) {
  size_t es = dtype_size(call.dtype);
  switch (call.collective) {
    case Collective::kReduceScatter:
      return size_t(call.send_count) * es;
    case Collective::kAllGather:
      return size_t(call.recv_count) * es;
    case Collective::kRecv:
      return size_t(call.recv_count) * es;
    default:
      return size_t(call.send_count) * es;
  }
}

void check_same_dtype(const Tensor& a, const Tensor& b, Collective c) {
  if (a.dtype() != b.dtype()) {
    LATTICE_THROW(DTypeError,
                  "{}: input is {} but output is {} ---> HINT: pass tensors of one dtype",
                  collective_name(c), a.describe(), b.describe());
  }
}

}  // namespace

Communicator::Communicator(std::shared_ptr<Transport> transport, CommConfig config)
    : transport_(std::move(transport)),
      rank_(transport_->world_rank()),
      context_(kWorldContext),
      name_("world"),
      config_(std::move(config)),
      stats_(transport_->world_size()),
      tuner_(transport_->kind(), transport_->world_size(), config_.profile) {
  for (int r = 0; r < transport_->world_size(); ++r) members_.push_back(r);
  transport_->create_context(context_, members_);
}

Communicator::Communicator(std::shared_ptr<Transport> transport, std::vector<int> members, int rank,
                           uint64_t context, std::string name, const CommConfig& config)
    : transport_(std::move(transport)),
      members_(std::move(members)),
      rank_(rank),
      context_(context),
      name_(std::move(name)),
      config_(config),
      stats_(int(members_.size())),
      tuner_(transport_->kind(), int(members_.size()), config_.profile) {
  transport_->create_context(context_, members_);
}

// ---- typed entry points: each builds a CallSpec for execute() ----

void Communicator::all_reduce(Tensor& data, ReduceOp op, const CollectiveOptions& options) {
  expect_defined(data, "all_reduce", "data");
  all_reduce(data.raw_data(), data.numel(), data.dtype(), op, options);
}

void Communicator::all_reduce(void* data, int64_t count, DType dtype, ReduceOp op,
                              const CollectiveOptions& options) {
  execute({Collective::kAllReduce, data, data, count, count, dtype, op, 0, 0, options});
}

void Communicator::reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op,
                                  const CollectiveOptions& options) {
  expect_defined(input, "reduce_scatter", "input");
  expect_defined(output, "reduce_scatter", "output");
  check_same_dtype(input, output, Collective::kReduceScatter);
  execute({Collective::kReduceScatter, input.raw_data(), output.raw_data(), input.numel(),
           output.numel(), input.dtype(), op, 0, 0, options});
}

void Communicator::reduce_scatter(const void* input, void* output, int64_t output_count,
                                  DType dtype, ReduceOp op, const CollectiveOptions& options) {
  execute({Collective::kReduceScatter, input, output, output_count * size(), output_count, dtype,
           op, 0, 0, options});
}

void Communicator::all_gather(const Tensor& input, Tensor& output,
                              const CollectiveOptions& options) {
  expect_defined(input, "all_gather", "input");
  expect_defined(output, "all_gather", "output");
  check_same_dtype(input, output, Collective::kAllGather);
  execute({Collective::kAllGather, input.raw_data(), output.raw_data(), input.numel(),
           output.numel(), input.dtype(), ReduceOp::kSum, 0, 0, options});
}

void Communicator::all_gather(const void* input, void* output, int64_t input_count, DType dtype,
                              const CollectiveOptions& options) {
  execute({Collective::kAllGather, input, output, input_count, input_count * size(), dtype,
           ReduceOp::kSum, 0, 0, options});
}

void Communicator::broadcast(Tensor& data, int root, const CollectiveOptions& options) {
  expect_defined(data, "broadcast", "data");
  broadcast(data.raw_data(), data.numel(), data.dtype(), root, options);
}

void Communicator::broadcast(void* data, int64_t count, DType dtype, int root,
                             const CollectiveOptions& options) {
  execute(
      {Collective::kBroadcast, data, data, count, count, dtype, ReduceOp::kSum, root, 0, options});
}

void Communicator::reduce(const Tensor& input, Tensor& output, int root, ReduceOp op,
                          const CollectiveOptions& options) {
  expect_defined(input, "reduce", "input");
  expect_defined(output, "reduce", "output");
  check_same_dtype(input, output, Collective::kReduce);
  execute({Collective::kReduce, input.raw_data(), output.raw_data(), input.numel(), output.numel(),
           input.dtype(), op, root, 0, options});
}

void Communicator::reduce(const void* input, void* output, int64_t count, DType dtype, int root,
                          ReduceOp op, const CollectiveOptions& options) {
  execute({Collective::kReduce, input, output, count, count, dtype, op, root, 0, options});
}

void Communicator::send(const Tensor& data, int peer, const CollectiveOptions& options) {
  expect_defined(data, "send", "data");
  send(data.raw_data(), data.numel(), data.dtype(), peer, options);
}

void Communicator::send(const void* data, int64_t count, DType dtype, int peer,
                        const CollectiveOptions& options) {
  execute({Collective::kSend, data, nullptr, count, 0, dtype, ReduceOp::kSum, 0, peer, options});
}

Communicator::SendHandle Communicator::send_async(const Tensor& data, int peer,
                                                  const CollectiveOptions& options) {
  expect_defined(data, "send_async", "data");
  LATTICE_CHECK(peer >= 0 && peer < size() && peer != rank_,
                "send_async to peer {} on group '{}' of {} ranks (this is rank {})", peer, name_,
                size(), rank_);
  SendHandle handle;
  const auto timeout = options.timeout.count() > 0 ? options.timeout : config_.timeout;
  handle.deadline_ = CommClock::now() + timeout;
  handle.what_ = fmt::format("send (tag {}) on group '{}' from rank {} to rank {}", options.tag,
                             name_, rank_, peer);
  handle.pending_ = transport_->post_send(members_[size_t(peer)], MessageKey{context_, options.tag},
                                          data.raw_data(), data.nbytes());
  stats_.record(Collective::kSend, Algorithm::kAuto, data.nbytes(), 0.0);
  return handle;
}

void Communicator::SendHandle::wait() {
  if (!pending_) return;
  try {
    pending_->wait(deadline_);
  } catch (const PeerTimeout& e) {
    LATTICE_THROW(TimeoutError,
                  "{} timed out: {} ---> HINT: match every send with a recv of the same tag on "
                  "the peer",
                  what_, e.what());
  }
  pending_.reset();
}

void Communicator::recv(Tensor& data, int peer, const CollectiveOptions& options) {
  expect_defined(data, "recv", "data");
  recv(data.raw_data(), data.numel(), data.dtype(), peer, options);
}

void Communicator::recv(void* data, int64_t count, DType dtype, int peer,
                        const CollectiveOptions& options) {
  execute({Collective::kRecv, nullptr, data, 0, count, dtype, ReduceOp::kSum, 0, peer, options});
}

void Communicator::all_to_all(const void* input, const std::vector<int64_t>& send_counts,
                              void* output, const std::vector<int64_t>& recv_counts, DType dtype,
                              const CollectiveOptions& options) {
  if (send_counts.size() != size_t(size()) || recv_counts.size() != size_t(size())) {
    LATTICE_THROW(ShapeError,
                  "all_to_all on group '{}': {} send and {} receive counts for {} ranks ---> "
                  "HINT: pass one count per rank of the group",
                  name_, send_counts.size(), recv_counts.size(), size());
  }
  int64_t sent = 0, received = 0;
  for (size_t j = 0; j < send_counts.size(); ++j) {
    sent += send_counts[j];
    received += recv_counts[j];
  }
  CallSpec call{Collective::kAllToAll, input, output, sent,   received, dtype,
                ReduceOp::kSum,        0,     0,      options};
  call.send_counts = send_counts.data();
  call.recv_counts = recv_counts.data();
  execute(call);
}

void Communicator::barrier(const CollectiveOptions& options) {
  execute(
      {Collective::kBarrier, nullptr, nullptr, 0, 0, DType::kF32, ReduceOp::kSum, 0, 0, options});
}

// ---- the one path every call takes ----

void Communicator::execute(const CallSpec& call) {
  validate_call(call, rank_, size(), transport_->has_native(), name_);
  const auto timeout = call.options.timeout.count() > 0 ? call.options.timeout : config_.timeout;
  const Deadline deadline = CommClock::now() + timeout;
  const size_t bytes = call_bytes(call);
  Stopwatch watch;
  if (call.collective == Collective::kSend || call.collective == Collective::kRecv) {
    point_to_point(call, deadline);
    stats_.record(call.collective, Algorithm::kAuto, bytes, watch.seconds());
    return;
  }
  const uint64_t seq = ++seq_;
  const CollectiveReport report(name_, seq);  // an agent's view of where this rank waits
  transport_->mark_arrival(context_, seq);
  const bool automatic = call.options.algorithm == Algorithm::kAuto;
  Algorithm algorithm =
      automatic ? planned_algorithm(call.collective, bytes) : call.options.algorithm;
  if (call.collective == Collective::kBarrier && algorithm != Algorithm::kNative) {
    algorithm = Algorithm::kTree;
  }
  // An all_to_all is never skipped: this rank may send nothing and still receive.
  const bool empty = bytes == 0 && call.collective != Collective::kBarrier &&
                     call.collective != Collective::kAllToAll;
  if (!empty) {
    try {
      run_algorithm(call, algorithm, seq, deadline);
    } catch (const PeerTimeout& e) {
      throw_timeout(call, seq, e);
    }
  }
  const double seconds = watch.seconds();
  stats_.record(call.collective, algorithm, bytes, seconds);
  const bool retuned = config_.algorithms == AlgorithmChoice::kRetunedAfterWindow ||
                       config_.algorithms == AlgorithmChoice::kRetunedAtStepBoundary;
  // One candidate (all_to_all, barrier): nothing to switch to. all_to_all's sizes also differ
  // by rank, so its windows would not close at the same call on every rank.
  if (automatic && retuned && !empty && size() > 1 &&
      tuner_.candidates(call.collective).size() > 1 &&
      tuner_.observe(call.collective, algorithm, bytes, seconds)) {
    if (config_.algorithms == AlgorithmChoice::kRetunedAfterWindow) {
      retune_if_slow(call.collective, bytes);
    } else {
      mark_window_closed(call.collective, bytes);
    }
  }
}

Algorithm Communicator::planned_algorithm(Collective collective, size_t bytes) const {
  if (config_.algorithms == AlgorithmChoice::kPinned) {
    if (collective == Collective::kAllToAll) return Algorithm::kPairwise;
    return collective == Collective::kBarrier ? Algorithm::kTree : Algorithm::kRing;
  }
  return tuner_.choose(collective, bytes);
}

void Communicator::point_to_point(const CallSpec& call, Deadline deadline) {
  const MessageKey key{context_, uint64_t(call.options.tag)};
  const int peer_world = members_[size_t(call.peer)];
  const size_t es = dtype_size(call.dtype);
  try {
    if (call.collective == Collective::kSend) {
      transport_->post_send(peer_world, key, call.send, size_t(call.send_count) * es)
          ->wait(deadline);
    } else {
      transport_->recv(peer_world, key, call.recv, size_t(call.recv_count) * es, deadline);
    }
  } catch (const PeerTimeout& e) {
    LATTICE_THROW(TimeoutError,
                  "{} (tag {}) on group '{}' timed out on rank {}: {} within the deadline ---> "
                  "HINT: match every send with a recv of the same tag on the peer",
                  collective_name(call.collective), call.options.tag, name_, rank_, e.what());
  }
}

void Communicator::throw_timeout(const CallSpec& call, uint64_t seq, const PeerTimeout& e) {
  std::optional<std::vector<int>> missing = transport_->missing_ranks(context_, seq, members_);
  auto waited = std::find(members_.begin(), members_.end(), e.peer());
  int waited_rank = waited == members_.end() ? -1 : int(waited - members_.begin());
  const auto timeout = call.options.timeout.count() > 0 ? call.options.timeout : config_.timeout;
  std::string who;
  if (e.peer() < 0) {  // a native collective: MPI does not say who is missing
    who = fmt::format("{} (the {} transport cannot tell which ranks entered the call)", e.what(),
                      transport_name(transport_->kind()));
  } else if (!missing) {
    who = fmt::format(
        "rank {} did not answer, this rank was waiting on it (the {} transport "
        "cannot tell which ranks entered the call)",
        waited_rank, transport_name(transport_->kind()));
  } else if (missing->empty()) {
    who = fmt::format("every rank arrived but rank {}, which this rank was waiting on, stalled",
                      waited_rank);
  } else {
    who = fmt::format("ranks {} did not arrive (this rank was waiting on rank {})", *missing,
                      waited_rank);
  }
  LATTICE_THROW(TimeoutError,
                "{} on group '{}' (sequence number {}, {} ranks) timed out after {} ms on rank "
                "{}: {} ---> HINT: every rank of the group "
                "must make the same collective calls in the same order; raise the timeout "
                "(CollectiveOptions::timeout, CommConfig::timeout) only if a rank is legitimately "
                "slow",
                collective_name(call.collective), name_, seq, size(), timeout.count(), rank_, who);
}

void* Communicator::work_buffer(size_t bytes) {
  if (work_.size() < bytes) work_.resize(bytes);
  return work_.data();
}

}  // namespace lattice
