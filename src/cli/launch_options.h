// The agent options of a `lattice launch` command, shared by `launch` and `bench elastic`.
#pragma once

#include <string>
#include <vector>

#include "elastic/agent.h"

namespace lattice::cli {

// `command` is the rank command after `--` ("train", CONFIG, flags): its config's [elastic]
// section (with its --set overrides) gives the timeouts, checked for order under gloo; the
// ranks run this executable. ConfigError for anything but `train CONFIG ...`, and for a
// layout whose world is not the nproc × nnodes ranks started.
AgentOptions launch_options(int nproc, std::vector<std::string> command, int nnodes = 1);

}  // namespace lattice::cli
