// One entry point that runs a rank function on any engine (DESIGN.md invariant 6), so a
// command is written once and runs on in-process ranks, under mpirun or under lattice launch:
//
//   launch_ranks(parse_transport(args.transport), mesh.world_size(),
//                [&](Communicator& world) { train_rank(world, ...); });
//
// threads: world_size ranks as threads of this process (run_ranks, thread_world.h); the first
//   exception of any rank is rethrown here after every rank has stopped.
// mpi: this process is one rank of a job started by mpirun / srun; body runs once, on the MPI
//   world. An exception leaves this process's launch_ranks; the other ranks then fail their
//   next collective with a TimeoutError within CommConfig::timeout.
// gloo: this process is one rank of a job started by `lattice launch` (LATTICE_* variables,
//   launch_env.h); body runs once, on a world that meets in the launcher's store under this
//   generation's prefix. The transport lives for the body only: a process runs one generation,
//   and its connections close when launch_ranks returns or throws (peers then fail at once).
//
// The transport names are parse_transport's (comm_types.h): "threads", "mpi" and "gloo".
//
// Test hook: LATTICE_SLOW_LINK=SRC:DST:MS[,...] delays every message from world rank SRC to DST
// by MS milliseconds on the threads transport (ThreadHub::set_link_delay): a slow link, to
// watch the collective tuner move off it (tests/cli/train_cli_test.cpp). Set under another
// transport it is a ConfigError.
#pragma once

#include <functional>
#include <optional>

#include "comm/communicator.h"
#include "comm/launch_env.h"

namespace lattice {

// Runs `body` on every rank of a world of `world_size` ranks on `transport`. Throws ConfigError
// before starting anything when world_size < 1, for mpi when the process was not started by
// a launcher of exactly world_size processes (the message names `mpirun -np world_size`), and
// for gloo when it was not started by `lattice launch` with LATTICE_WORLD_SIZE = world_size.
//
// Under mpi, MPI is initialised on the first call and finalised when the process exits, so
// launch_ranks may run more than once in one process, from the same thread each time.
void launch_ranks(TransportKind transport, int world_size,
                  const std::function<void(Communicator&)>& body, CommConfig config = {});

// The check launch_ranks makes before touching MPI: `launch` (detect_launch_environment()) must
// describe a job of world_size processes. Returns it; throws ConfigError naming the fix.
LaunchEnvironment require_mpi_launch(const std::optional<LaunchEnvironment>& launch,
                                     int world_size);

// The same check for gloo: `launch` (detect_gloo_environment()) must describe a `lattice launch`
// job of world_size processes.
GlooLaunchEnvironment require_gloo_launch(const std::optional<GlooLaunchEnvironment>& launch,
                                          int world_size);

}  // namespace lattice
