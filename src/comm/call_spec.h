// A collective call reduced to pointers and counts, and the one place every call is checked
// (after NCCL's ncclEnqueueCheck): counts, dtype, divisibility, roots and peers, aliasing.
#pragma once

#include <cstdint>

#include "comm/comm_types.h"
#include "core/dtype.h"

namespace lattice {

struct CallSpec {
  Collective collective = Collective::kAllReduce;
  const void* send = nullptr;  // all_reduce and broadcast: same as recv (in place)
  void* recv = nullptr;
  int64_t send_count = 0;  // elements
  int64_t recv_count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;  // broadcast, reduce: group rank
  int peer = 0;  // send, recv: group rank
  CollectiveOptions options;
  // all_to_all: elements to (from) each group rank, n entries each; send_count and recv_count
  // are their sums. Blocks lie in rank order in the input (output).
  const int64_t* send_counts = nullptr;
  const int64_t* recv_counts = nullptr;
};

// Throws ShapeError (counts, divisibility), DTypeError, or ValueError (roots, peers, aliasing,
// options) naming the collective, the group and the fix.
void validate_call(const CallSpec& call, int group_rank, int group_size, bool has_native,
                   const std::string& group_name);

}  // namespace lattice
