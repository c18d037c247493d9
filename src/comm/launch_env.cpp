#include "comm/launch_env.h"

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace lattice {
namespace {

struct LauncherVars {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
};

// In order of precedence: under `srun --mpi=pmix` both OpenMPI's and Slurm's are set and agree.
constexpr LauncherVars kLaunchers[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

int parse_int(const char* name, const char* value) {
  std::string_view text(value);
  int out = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec != std::errc() || end != text.data() + text.size()) {
    LATTICE_THROW(ConfigError, "launcher variable {}='{}' is not an integer", name, value);
  }
  return out;
}

}  // namespace

std::optional<LaunchEnvironment> detect_launch_environment(const EnvLookup& getenv_fn) {
  for (const LauncherVars& vars : kLaunchers) {
    const char* rank = getenv_fn(vars.rank);
    const char* size = getenv_fn(vars.size);
    if (rank == nullptr || size == nullptr) continue;
    LaunchEnvironment env;
    env.launcher = vars.launcher;
    env.rank = parse_int(vars.rank, rank);
    env.size = parse_int(vars.size, size);
    const char* local = getenv_fn(vars.local_rank);
    env.local_rank = local != nullptr ? parse_int(vars.local_rank, local) : 0;
    if (env.size < 1 || env.rank < 0 || env.rank >= env.size) {
      LATTICE_THROW(ConfigError, "launcher variables {}={} {}={} do not describe a rank", vars.rank,
                    rank, vars.size, size);
    }
    return env;
  }
  return std::nullopt;
}

std::optional<LaunchEnvironment> detect_launch_environment() {
  return detect_launch_environment([](const char* name) { return std::getenv(name); });
}

}  // namespace lattice
