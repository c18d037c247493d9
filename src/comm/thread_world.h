// The thread-per-rank harness (after Gloo's `spawn`): runs a function on N in-process ranks,
// each with its own world Communicator on the threads transport, and rethrows the first
// exception. When a rank throws, the others are woken at once with a CommError instead of
// waiting for their deadlines. Tests of every layer use it for multi-rank equivalence tests:
//
//   run_ranks(4, [&](Communicator& comm) { ... comm.all_reduce(grad, ReduceOp::kSum); ... });
#pragma once

#include <functional>
#include <memory>

#include "comm/communicator.h"
#include "comm/thread_transport.h"

namespace lattice {

struct ThreadWorldOptions {
  CommConfig config;
  // Runs on the hub before the ranks start (e.g. ThreadHub::set_link_delay).
  std::function<void(ThreadHub&)> setup;
};

void run_ranks(int world_size, const std::function<void(Communicator&)>& body,
               const ThreadWorldOptions& options = {});

}  // namespace lattice
