#include "comm/launch.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <utility>

#include "comm/gloo_transport.h"
#include "comm/mpi_transport.h"
#include "comm/thread_world.h"
#include "core/error.h"

namespace lattice {
namespace {

// MPI can be initialised only once per process, so the first mpi launch creates the transport
// and it lives until the process exits (its destructor finalises MPI).
std::shared_ptr<MpiTransport> process_mpi_transport() {
  static const std::shared_ptr<MpiTransport> transport = MpiTransport::create();
  return transport;
}

}  // namespace

LaunchEnvironment require_mpi_launch(const std::optional<LaunchEnvironment>& launch,
                                     int world_size) {
  if (!launch) {
    LATTICE_THROW(ConfigError,
                  "--transport mpi needs {} processes started by a launcher, but this process was "
                  "started by hand (no OMPI_COMM_WORLD_*, PMI_* or SLURM_* variables) ---> HINT: "
                  "run it as `mpirun -np {} <command>`, or use --transport threads to run the {} "
                  "ranks inside this process",
                  world_size, world_size, world_size);
  }
  if (launch->size != world_size) {
    LATTICE_THROW(ConfigError,
                  "--transport mpi needs {} processes, but the {} launcher started {} ---> HINT: "
                  "launch with `mpirun -np {}` (or `srun -n {}`), or choose a layout of {} ranks",
                  world_size, launch->launcher, launch->size, world_size, world_size, launch->size);
  }
  return *launch;
}

GlooLaunchEnvironment require_gloo_launch(const std::optional<GlooLaunchEnvironment>& launch,
                                          int world_size) {
  if (!launch) {
    LATTICE_THROW(ConfigError,
                  "--transport gloo needs {} processes started by `lattice launch`, but this "
                  "process was started by hand (no LATTICE_RANK, LATTICE_WORLD_SIZE, "
                  "LATTICE_STORE or LATTICE_GENERATION) ---> HINT: --transport gloo runs under "
                  "`lattice launch --nproc-per-node {} -- train ...`; or use --transport threads "
                  "to run the {} ranks inside this process",
                  world_size, world_size, world_size);
  }
  if (launch->size != world_size) {
    LATTICE_THROW(ConfigError,
                  "--transport gloo needs {} processes, but lattice launch started {} "
                  "(LATTICE_WORLD_SIZE={}) ---> HINT: launch with `lattice launch "
                  "--nproc-per-node {} -- train ...`, or choose a layout of {} ranks",
                  world_size, launch->size, launch->size, world_size, launch->size);
  }
  return *launch;
}

void launch_ranks(TransportKind transport, int world_size,
                  const std::function<void(Communicator&)>& body, CommConfig config) {
  if (world_size < 1) {
    LATTICE_THROW(ConfigError,
                  "cannot launch a world of {} ranks ---> HINT: the world size is the product of "
                  "the layout (pp·dp·tp), and every axis needs at least one rank",
                  world_size);
  }
  switch (transport) {
    case TransportKind::kThreads: {
      ThreadWorldOptions options;
      options.config = std::move(config);
      run_ranks(world_size, body, options);
      return;
    }
    case TransportKind::kMpi: {
      require_mpi_launch(detect_launch_environment(), world_size);
      // MpiTransport cross-checks MPI's own rank and size against the launcher's variables.
      Communicator world(process_mpi_transport(), std::move(config));
      try {
        body(world);
      } catch (const std::exception& e) {
        // A rank that fails ends the whole job now, with its error: returning would leave the
        // other ranks blocked on it and MPI_Finalize waiting on requests that never complete.
        spdlog::error("rank {} of {}: {}", world.rank(), world.size(), e.what());
        abort_mpi_job(1);
      }
      return;
    }
    case TransportKind::kGloo: {
      const GlooLaunchEnvironment env = require_gloo_launch(detect_gloo_environment(), world_size);
      GlooOptions options;
      options.rank = env.rank;
      options.size = env.size;
      options.store_path = env.store;
      options.prefix = env.prefix();
      options.hostname = env.bind_addr;
      options.timeout = config.timeout;
      // One generation per process: the world and its connections end with the body.
      Communicator world(GlooTransport::create(options), std::move(config));
      body(world);
      return;
    }
  }
  LATTICE_THROW(ValueError, "launch_ranks: unknown transport {}", int(transport));
}

}  // namespace lattice
