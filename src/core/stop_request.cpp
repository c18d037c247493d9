#include "core/stop_request.h"

#include <signal.h>

#include <string.h>

#include <atomic>

namespace lattice {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

void on_stop_signal(int signal) {
  g_signal.store(signal, std::memory_order_relaxed);
}

}  // namespace

void install_stop_request_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  // The signal lands on any thread of the rank: a blocking call there (a store's socket read, a
  // snapshot's write, waitpid) is restarted rather than failed with EINTR mid-protocol.
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);
}

int stop_requested() {
  return g_signal.load(std::memory_order_relaxed);
}

std::string signal_name(int signal) {
  const char* abbreviation = ::sigabbrev_np(signal);  // "TERM"; null for an unknown number
  return abbreviation != nullptr ? std::string("SIG") + abbreviation
                                 : "signal " + std::to_string(signal);
}

}  // namespace lattice
