// A request to stop cleanly (SIGTERM: a scheduler's preemption; SIGINT), for `lattice train`
// to finish the step in flight, write a durable checkpoint and exit 0 (docs/elastic.md).
#pragma once

#include <string>

namespace lattice {

// Installs SIGTERM and SIGINT handlers that only set the flag (async-signal-safe).
void install_stop_request_handlers();
// The signal that asked to stop, or 0.
int stop_requested();

// "SIGTERM" for 15: the name a user sends with `kill -s`.
std::string signal_name(int signal);

}  // namespace lattice
