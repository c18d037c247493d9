// One entry point that runs a rank function on either engine (DESIGN.md invariant 6), so a
// command is written once and runs on in-process ranks or under mpirun:
//
//   launch_ranks(parse_transport(args.transport), mesh.world_size(),
//                [&](Communicator& world) { train_rank(world, ...); });
//
// threads: world_size ranks as threads of this process (run_ranks, thread_world.h); the first
//   exception of any rank is rethrown here after every rank has stopped.
// mpi: this process is one rank of a job started by mpirun / srun; body runs once, on the MPI
//   world. An exception leaves this process's launch_ranks; the other ranks then fail their
//   next collective with a TimeoutError within CommConfig::timeout.
//
// The transport names are parse_transport's (comm_types.h): "threads" and "mpi".
#pragma once

#include <functional>
#include <optional>

#include "comm/communicator.h"
#include "comm/launch_env.h"

namespace lattice {

// Runs `body` on every rank of a world of `world_size` ranks on `transport`. Throws ConfigError
// before starting anything when world_size < 1, or for mpi when the process was not started by
// a launcher of exactly world_size processes (the message names `mpirun -np world_size`).
//
// Under mpi, MPI is initialised on the first call and finalised when the process exits, so
// launch_ranks may run more than once in one process, from the same thread each time.
void launch_ranks(TransportKind transport, int world_size,
                  const std::function<void(Communicator&)>& body, CommConfig config = {});

// The check launch_ranks makes before touching MPI: `launch` (detect_launch_environment()) must
// describe a job of world_size processes. Returns it; throws ConfigError naming the fix.
LaunchEnvironment require_mpi_launch(const std::optional<LaunchEnvironment>& launch,
                                     int world_size);

}  // namespace lattice
