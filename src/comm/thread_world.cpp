#include "comm/thread_world.h"

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace lattice {

void run_ranks(int world_size, const std::function<void(Communicator&)>& body,
               const ThreadWorldOptions& options) {
  if (world_size < 1) {
    LATTICE_THROW(ValueError, "run_ranks: world size {} must be at least 1", world_size);
  }
  auto hub = std::make_shared<ThreadHub>(world_size);
  if (options.setup) options.setup(*hub);
  std::mutex error_mutex;
  std::exception_ptr first_error;
  auto rank_main = [&](int rank) {
    try {
      Communicator comm(hub->transport(rank), options.config);
      body(comm);
    } catch (const std::exception& e) {
      {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      hub->abort(rank, e.what());
    } catch (...) {
      {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      hub->abort(rank, "unknown exception");
    }
  };
  std::vector<std::jthread> threads;
  for (int r = 1; r < world_size; ++r) threads.emplace_back(rank_main, r);
  rank_main(0);  // rank 0 runs on the caller's thread
  threads.clear();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace lattice
