// Where a process sits in a multi-process launch, read from the launcher's environment:
// OpenMPI's mpirun (OMPI_COMM_WORLD_*), PMI-based launchers such as MPICH's Hydra (PMI_*), and
// Slurm's srun (SLURM_*). The MPI transport cross-checks it against MPI's own view.
//
// `lattice launch` (the gloo transport) sets its own variables for each rank process:
// LATTICE_RANK, LATTICE_WORLD_SIZE, LATTICE_LOCAL_RANK, LATTICE_STORE (the rendezvous FileStore
// directory), LATTICE_GENERATION (bumped on every restart of the world) and, optionally,
// LATTICE_BIND_ADDR (default 127.0.0.1).
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace lattice {

struct LaunchEnvironment {
  std::string launcher;  // "openmpi", "pmi", "slurm"
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes on this node
};

using EnvLookup = std::function<const char*(const char*)>;

// Returns nullopt when no launcher variables are set (a process started by hand). Throws
// ConfigError when they are set but malformed (non-numeric, rank outside [0, size)).
std::optional<LaunchEnvironment> detect_launch_environment(const EnvLookup& getenv_fn);
std::optional<LaunchEnvironment> detect_launch_environment();  // from the process environment

struct GlooLaunchEnvironment {
  int rank = 0;
  int size = 1;
  int local_rank = 0;                   // LATTICE_LOCAL_RANK, 0 when unset
  std::string store;                    // LATTICE_STORE
  int generation = 0;                   // LATTICE_GENERATION
  std::string bind_addr = "127.0.0.1";  // LATTICE_BIND_ADDR
  // The rendezvous key prefix of this generation: "gen<N>/".
  std::string prefix() const { return "gen" + std::to_string(generation) + "/"; }
};

// Returns nullopt when none of LATTICE_RANK, LATTICE_WORLD_SIZE, LATTICE_STORE and
// LATTICE_GENERATION is set (not started by `lattice launch`). Throws ConfigError when some are
// set but not all, or one is malformed (non-numeric, rank outside [0, size), negative
// generation, empty store).
std::optional<GlooLaunchEnvironment> detect_gloo_environment(const EnvLookup& getenv_fn);
std::optional<GlooLaunchEnvironment> detect_gloo_environment();  // from the process environment

}  // namespace lattice
