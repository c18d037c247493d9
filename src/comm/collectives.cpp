// Each collective as a composition of the algorithm building blocks (algorithms.h), with the
// staging its buffers need: reduce_scatter and reduce work on a copy of their (const) input,
// and bf16 sums run on an fp32 copy so that partial sums are never rounded to bf16.
#include <cstring>

#include "comm/algorithms.h"
#include "comm/communicator.h"

namespace lattice {
namespace {

// Copies (or widens) `count` elements of `src` into `dst`, whose dtype is `dst_dtype`.
void stage(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count) {
  if (count == 0 || src == dst) return;
  if (src_dtype == dst_dtype) {
    std::memmove(dst, src, size_t(count) * dtype_size(src_dtype));
  } else {
    convert(src, src_dtype, dst, dst_dtype, count);
  }
}

void* offset(void* base, int64_t elements, DType dtype) {
  return static_cast<std::byte*>(base) + size_t(elements) * dtype_size(dtype);
}
const void* offset(const void* base, int64_t elements, DType dtype) {
  return static_cast<const std::byte*>(base) + size_t(elements) * dtype_size(dtype);
}

}  // namespace

void Communicator::run_algorithm(const CallSpec& call, Algorithm algorithm, uint64_t seq,
                                 Deadline deadline) {
  const int n = size();
  if (algorithm == Algorithm::kNative) {
    NativeCall native{call.collective, call.send, call.recv, call.send_count,
                      call.dtype,      call.op,   call.root};
    if (call.collective == Collective::kReduceScatter) native.count = call.recv_count;
    transport_->run_native(context_, native, deadline);
    return;
  }
  const bool reduces = call.collective == Collective::kAllReduce ||
                       call.collective == Collective::kReduceScatter ||
                       call.collective == Collective::kReduce;
  const bool widen = reduces && call.dtype == DType::kBF16 && call.op == ReduceOp::kSum;
  const DType work_dtype = widen ? DType::kF32 : call.dtype;
  const int root =
      (call.collective == Collective::kBroadcast || call.collective == Collective::kReduce)
          ? call.root
          : 0;
  Exchange ex(*transport_, members_, rank_, root, context_,
              collective_tag_base(call.options.tag, seq), deadline, work_dtype, call.op);
  switch (call.collective) {
    case Collective::kAllReduce: {
      const int64_t count = call.recv_count;
      void* buf = call.recv;
      if (widen) {
        buf = work_buffer(size_t(count) * sizeof(float));
        stage(call.recv, call.dtype, buf, work_dtype, count);
      }
      const Blocks blocks = Blocks::balanced(n, count);
      if (algorithm == Algorithm::kRing) {
        ring_reduce_scatter(ex, buf, blocks);
        ex.next_phase();
        ring_all_gather(ex, buf, blocks);
      } else if (algorithm == Algorithm::kHalvingDoubling) {
        hd_reduce_scatter(ex, buf, blocks);
        ex.next_phase();
        hd_all_gather(ex, buf, blocks);
      } else {
        tree_reduce(ex, buf, count);
        ex.next_phase();
        tree_broadcast(ex, buf, count);
      }
      stage(buf, work_dtype, call.recv, call.dtype, count);
      return;
    }
    case Collective::kReduceScatter: {
      const int64_t per_rank = call.recv_count;
      void* buf = work_buffer(size_t(call.send_count) * dtype_size(work_dtype));
      stage(call.send, call.dtype, buf, work_dtype, call.send_count);
      const Blocks blocks = Blocks::uniform(n, per_rank);
      if (algorithm == Algorithm::kRing) {
        ring_reduce_scatter(ex, buf, blocks);
      } else if (algorithm == Algorithm::kHalvingDoubling) {
        hd_reduce_scatter(ex, buf, blocks);
      } else {
        tree_reduce(ex, buf, call.send_count);
        ex.next_phase();
        tree_scatter(ex, buf, blocks);
      }
      stage(offset(buf, blocks.start(rank_), work_dtype), work_dtype, call.recv, call.dtype,
            per_rank);
      return;
    }
    case Collective::kAllGather: {
      stage(call.send, call.dtype, offset(call.recv, call.send_count * rank_, call.dtype),
            call.dtype, call.send_count);
      const Blocks blocks = Blocks::uniform(n, call.send_count);
      if (algorithm == Algorithm::kRing) {
        ring_all_gather(ex, call.recv, blocks);
      } else if (algorithm == Algorithm::kHalvingDoubling) {
        hd_all_gather(ex, call.recv, blocks);
      } else {
        tree_gather(ex, call.recv, blocks);
        ex.next_phase();
        tree_broadcast(ex, call.recv, call.recv_count);
      }
      return;
    }
    case Collective::kBroadcast: {
      const int64_t count = call.recv_count;
      if (algorithm == Algorithm::kRing) {
        ring_broadcast(ex, call.recv, count);
      } else if (algorithm == Algorithm::kHalvingDoubling) {
        // van de Geijn: scatter the blocks, then all-gather them.
        const Blocks blocks = Blocks::balanced(n, count);
        tree_scatter(ex, call.recv, blocks);
        ex.next_phase();
        hd_all_gather(ex, call.recv, blocks);
      } else {
        tree_broadcast(ex, call.recv, count);
      }
      return;
    }
    case Collective::kReduce: {
      const int64_t count = call.send_count;
      void* buf = work_buffer(size_t(count) * dtype_size(work_dtype));
      stage(call.send, call.dtype, buf, work_dtype, count);
      const Blocks blocks = Blocks::balanced(n, count);
      if (algorithm == Algorithm::kTree) {
        tree_reduce(ex, buf, count);
      } else {
        if (algorithm == Algorithm::kRing) {
          ring_reduce_scatter(ex, buf, blocks);
        } else {
          hd_reduce_scatter(ex, buf, blocks);
        }
        ex.next_phase();
        tree_gather(ex, buf, blocks);
      }
      if (rank_ == call.root) stage(buf, work_dtype, call.recv, call.dtype, count);
      return;
    }
    case Collective::kBarrier: {
      // Zero-byte messages up and down a binomial tree: nobody leaves before everyone arrived.
      tree_reduce(ex, nullptr, 0);
      ex.next_phase();
      tree_broadcast(ex, nullptr, 0);
      return;
    }
    case Collective::kAllToAll: {
      // Step s: to r + s, from r - s. Each step's send is posted before its receive, so two
      // ranks exchanging with each other never wait on one another. Empty blocks are sent too:
      // a rank expecting another length then fails at once, naming both ranks.
      std::vector<int64_t> send_at(size_t(n) + 1, 0), recv_at(size_t(n) + 1, 0);
      for (int j = 0; j < n; ++j) {
        send_at[size_t(j) + 1] = send_at[size_t(j)] + call.send_counts[j];
        recv_at[size_t(j) + 1] = recv_at[size_t(j)] + call.recv_counts[j];
      }
      stage(offset(call.send, send_at[size_t(rank_)], call.dtype), call.dtype,
            offset(call.recv, recv_at[size_t(rank_)], call.dtype), call.dtype,
            call.send_counts[rank_]);
      for (int s = 1; s < n; ++s) {
        const int to = (rank_ + s) % n, from = (rank_ - s + n) % n;
        PendingSendPtr sent =
            ex.send(to, s, call.send, send_at[size_t(to)], send_at[size_t(to) + 1]);
        ex.recv(from, s, call.recv, recv_at[size_t(from)], recv_at[size_t(from) + 1]);
        sent->wait(deadline);
      }
      return;
    }
    case Collective::kSend:
    case Collective::kRecv:
      break;
  }
  LATTICE_CHECK(false, "run_algorithm: {} is not a collective", collective_name(call.collective));
}

}  // namespace lattice
