#include "comm/launch.h"

#include <spdlog/spdlog.h>

#include <charconv>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

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

struct SlowLink {
  int src = 0;
  int dst = 0;
  int64_t delay_ms = 0;
};

// LATTICE_SLOW_LINK=SRC:DST:MS[,...] (launch.h); ConfigError naming the item and the grammar.
std::vector<SlowLink> slow_links_from_environment(int world_size) {
  const char* text = std::getenv("LATTICE_SLOW_LINK");
  std::vector<SlowLink> links;
  // A world of one rank has no link to slow (the doctor's one-rank run next to its layout).
  if (text == nullptr || world_size == 1) return links;
  std::string_view rest(text);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    SlowLink link;
    const char* p = item.data();
    const char* end = item.data() + item.size();
    auto number = [&](auto& out, bool last) {
      auto [next, ec] = std::from_chars(p, end, out);
      const bool ok = ec == std::errc{} && (last ? next == end : next != end && *next == ':');
      p = ok && !last ? next + 1 : next;
      return ok;
    };
    const bool parsed = number(link.src, false) && number(link.dst, false) &&
                        number(link.delay_ms, true) && link.delay_ms >= 0;
    if (!parsed || link.src < 0 || link.src >= world_size || link.dst < 0 ||
        link.dst >= world_size || link.src == link.dst) {
      LATTICE_THROW(ConfigError,
                    "LATTICE_SLOW_LINK item '{}' ---> HINT: use SRC:DST:MS, two different ranks "
                    "of the {}-rank world and a delay in milliseconds, e.g. 0:1:20",
                    item, world_size);
    }
    links.push_back(link);
  }
  return links;
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
  if (transport != TransportKind::kThreads && std::getenv("LATTICE_SLOW_LINK") != nullptr) {
    LATTICE_THROW(ConfigError,
                  "LATTICE_SLOW_LINK delays links of the threads transport only, not {} ---> "
                  "HINT: unset it, or run with --transport threads",
                  transport_name(transport));
  }
  switch (transport) {
    case TransportKind::kThreads: {
      ThreadWorldOptions options;
      options.config = std::move(config);
      const std::vector<SlowLink> slow = slow_links_from_environment(world_size);
      if (!slow.empty()) {
        options.setup = [slow](ThreadHub& hub) {
          for (const SlowLink& link : slow) {
            hub.set_link_delay(link.src, link.dst, std::chrono::milliseconds(link.delay_ms));
          }
        };
      }
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
