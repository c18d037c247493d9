#include "comm/transport.h"

#include <cstddef>
#include <vector>

#include "comm/reduce_kernels.h"

namespace lattice {

void Transport::recv_reduce(int peer, MessageKey key, void* acc, int64_t count, DType dtype,
                            ReduceOp op, Deadline deadline) {
  const size_t bytes = size_t(count) * dtype_size(dtype);
  thread_local std::vector<std::byte> staging;
  if (staging.size() < bytes) staging.resize(bytes);
  recv(peer, key, staging.data(), bytes, deadline);
  reduce_into(acc, staging.data(), count, dtype, op);
}

void Transport::run_native(uint64_t context, const NativeCall& call, Deadline deadline) {
  LATTICE_THROW(ValueError,
                "{}: algorithm 'native' needs the mpi transport, this is '{}' ---> HINT: use "
                "ring, hd, tree or auto",
                collective_name(call.collective), transport_name(kind()));
}

}  // namespace lattice
