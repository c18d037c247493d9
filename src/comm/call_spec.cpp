#include "comm/call_spec.h"

#include <string>

#include "core/error.h"

namespace lattice {
namespace {

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

bool reduces(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kReduce;
}

}  // namespace

void validate_call(const CallSpec& call, int group_rank, int group_size, bool has_native,
                   const std::string& group_name) {
  const std::string where =
      fmt::format("{} on group '{}' (rank {} of {})", collective_name(call.collective), group_name,
                  group_rank, group_size);
  const int n = group_size;
  if (call.send_count < 0 || call.recv_count < 0) {
    LATTICE_THROW(ShapeError, "{}: negative count (send {}, recv {})", where, call.send_count,
                  call.recv_count);
  }
  if ((call.send_count > 0 && call.send == nullptr) ||
      (call.recv_count > 0 && call.recv == nullptr)) {
    LATTICE_THROW(ValueError, "{}: null buffer for a non-empty count", where);
  }
  if (reduces(call.collective) && call.dtype != DType::kF32 && call.dtype != DType::kBF16) {
    LATTICE_THROW(DTypeError, "{}: cannot reduce {} ---> HINT: reduce f32 or bf16 tensors", where,
                  dtype_name(call.dtype));
  }
  if (call.options.timeout.count() < 0) {
    LATTICE_THROW(ValueError, "{}: negative timeout {} ms", where, call.options.timeout.count());
  }
  if (call.options.algorithm == Algorithm::kNative && !has_native) {
    LATTICE_THROW(ValueError,
                  "{}: algorithm 'native' needs the mpi transport ---> HINT: use ring, hd, tree "
                  "or auto",
                  where);
  }
  const size_t es = dtype_size(call.dtype);
  const size_t send_bytes = size_t(call.send_count) * es, recv_bytes = size_t(call.recv_count) * es;
  switch (call.collective) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
      LATTICE_CHECK(call.send == call.recv && call.send_count == call.recv_count);
      break;
    case Collective::kReduceScatter:
      if (call.send_count % n != 0) {
        LATTICE_THROW(ShapeError,
                      "{}: input count {} is not divisible by the group size {} ---> HINT: pad "
                      "the input to a multiple of {}",
                      where, call.send_count, n, n);
      }
      if (call.recv_count != call.send_count / n) {
        LATTICE_THROW(ShapeError, "{}: output count {} must be input count {} / group size {} = {}",
                      where, call.recv_count, call.send_count, n, call.send_count / n);
      }
      if (overlaps(call.send, send_bytes, call.recv, recv_bytes)) {
        LATTICE_THROW(ValueError,
                      "{}: input and output overlap ---> HINT: pass a separate output buffer",
                      where);
      }
      break;
    case Collective::kAllGather: {
      if (call.recv_count != call.send_count * n) {
        LATTICE_THROW(ShapeError, "{}: output count {} must be input count {} x group size {} = {}",
                      where, call.recv_count, call.send_count, n, call.send_count * n);
      }
      const void* in_place =
          static_cast<const std::byte*>(call.recv) + size_t(group_rank) * send_bytes;
      if (call.send != in_place && overlaps(call.send, send_bytes, call.recv, recv_bytes)) {
        LATTICE_THROW(ValueError,
                      "{}: input overlaps the output other than as this rank's block ---> HINT: "
                      "pass a separate input, or the output's block {} for in-place use",
                      where, group_rank);
      }
      break;
    }
    case Collective::kReduce:
      if (call.send_count != call.recv_count) {
        LATTICE_THROW(ShapeError, "{}: input count {} and output count {} differ", where,
                      call.send_count, call.recv_count);
      }
      if (call.send != call.recv && overlaps(call.send, send_bytes, call.recv, recv_bytes)) {
        LATTICE_THROW(ValueError, "{}: input and output partly overlap", where);
      }
      break;
    case Collective::kSend:
    case Collective::kRecv:
      if (call.peer < 0 || call.peer >= n || call.peer == group_rank) {
        LATTICE_THROW(ValueError, "{}: peer {} is not another rank of the group (0..{})", where,
                      call.peer, n - 1);
      }
      break;
    case Collective::kBarrier:
      break;
    case Collective::kAllToAll: {
      LATTICE_CHECK(call.send_counts != nullptr && call.recv_counts != nullptr,
                    "{}: per-rank counts missing", where);
      int64_t sent = 0, received = 0;
      for (int j = 0; j < n; ++j) {
        if (call.send_counts[j] < 0 || call.recv_counts[j] < 0) {
          LATTICE_THROW(ShapeError, "{}: negative count for rank {} (send {}, recv {})", where, j,
                        call.send_counts[j], call.recv_counts[j]);
        }
        sent += call.send_counts[j];
        received += call.recv_counts[j];
      }
      if (sent != call.send_count || received != call.recv_count) {
        LATTICE_THROW(ShapeError,
                      "{}: the per-rank counts sum to {} sent and {} received, but the buffers "
                      "hold {} and {} ---> HINT: size the input and output to the sums of the "
                      "counts",
                      where, sent, received, call.send_count, call.recv_count);
      }
      if (call.send_counts[group_rank] != call.recv_counts[group_rank]) {
        LATTICE_THROW(ShapeError,
                      "{}: this rank sends itself {} elements but expects {} ---> HINT: the block "
                      "a rank keeps has one count",
                      where, call.send_counts[group_rank], call.recv_counts[group_rank]);
      }
      if (overlaps(call.send, send_bytes, call.recv, recv_bytes)) {
        LATTICE_THROW(ValueError,
                      "{}: input and output overlap ---> HINT: pass a separate output buffer",
                      where);
      }
      break;
    }
  }
  const bool pairwise_only = call.collective == Collective::kAllToAll;
  const Algorithm forced = call.options.algorithm;
  if (forced != Algorithm::kAuto && pairwise_only != (forced == Algorithm::kPairwise)) {
    LATTICE_THROW(ValueError,
                  "{}: algorithm '{}' does not run this collective ---> HINT: all_to_all runs "
                  "'pairwise' (or auto); the others ring, hd, tree, native or auto",
                  where, algorithm_name(forced));
  }
  if ((call.collective == Collective::kBroadcast || call.collective == Collective::kReduce) &&
      (call.root < 0 || call.root >= n)) {
    LATTICE_THROW(ValueError, "{}: root {} is not a rank of the group (0..{})", where, call.root,
                  n - 1);
  }
}

}  // namespace lattice
