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

std::optional<GlooLaunchEnvironment> detect_gloo_environment(const EnvLookup& getenv_fn) {
  constexpr const char* kRequired[] = {"LATTICE_RANK", "LATTICE_WORLD_SIZE", "LATTICE_STORE",
                                       "LATTICE_GENERATION"};
  std::string set, unset;
  for (const char* name : kRequired) {
    std::string& list = getenv_fn(name) != nullptr ? set : unset;
    list += list.empty() ? name : fmt::format(", {}", name);
  }
  if (set.empty()) return std::nullopt;
  if (!unset.empty()) {
    LATTICE_THROW(ConfigError,
                  "{} set but {} not: this process looks half-started by `lattice launch` "
                  "---> HINT: start every rank with `lattice launch`, which sets all of them",
                  set, unset);
  }
  GlooLaunchEnvironment env;
  env.rank = parse_int("LATTICE_RANK", getenv_fn("LATTICE_RANK"));
  env.size = parse_int("LATTICE_WORLD_SIZE", getenv_fn("LATTICE_WORLD_SIZE"));
  env.generation = parse_int("LATTICE_GENERATION", getenv_fn("LATTICE_GENERATION"));
  env.store = getenv_fn("LATTICE_STORE");
  if (const char* local = getenv_fn("LATTICE_LOCAL_RANK")) {
    env.local_rank = parse_int("LATTICE_LOCAL_RANK", local);
  }
  if (const char* bind = getenv_fn("LATTICE_BIND_ADDR"); bind != nullptr && *bind != '\0') {
    env.bind_addr = bind;
  }
  if (env.size < 1 || env.rank < 0 || env.rank >= env.size) {
    LATTICE_THROW(ConfigError,
                  "launcher variables LATTICE_RANK={} LATTICE_WORLD_SIZE={} do not describe a "
                  "rank",
                  env.rank, env.size);
  }
  if (env.generation < 0 || env.store.empty()) {
    LATTICE_THROW(ConfigError,
                  "launcher variables LATTICE_GENERATION={} LATTICE_STORE='{}' do not describe a "
                  "rendezvous (the generation counts from 0, the store is a directory)",
                  env.generation, env.store);
  }
  return env;
}

std::optional<GlooLaunchEnvironment> detect_gloo_environment() {
  return detect_gloo_environment([](const char* name) { return std::getenv(name); });
}

}  // namespace lattice
