// Where a process sits in a multi-process launch, read from the launcher's environment:
// OpenMPI's mpirun (OMPI_COMM_WORLD_*), PMI-based launchers such as MPICH's Hydra (PMI_*), and
// Slurm's srun (SLURM_*). The MPI transport cross-checks it against MPI's own view.
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

}  // namespace lattice
