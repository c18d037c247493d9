#include "elastic/elastic_rank.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/gloo_transport.h"
#include "core/rank_progress.h"
#include "elastic/snapshot_replica.h"

namespace lattice {
namespace {

std::string environment(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

}  // namespace

void run_elastic_rank(RankSession& session, const ElasticRankBody& body, CommConfig config) {
  LATTICE_CHECK(session.agent().has_value(), "run_elastic_rank needs a rank started by an agent");
  const std::string store = environment("LATTICE_STORE", "");
  const std::string bind_addr = environment("LATTICE_BIND_ADDR", "127.0.0.1");
  const std::string secret = environment("LATTICE_JOB_SECRET", "");
  const int nnodes = std::stoi(environment("LATTICE_NNODES", "1"));
  const int32_t node = std::stoi(environment("LATTICE_NODE", "0"));
  int64_t after = -1;  // the last generation this process joined
  std::string lost;    // why it left it
  bool spare = true;   // started idle, or kept idle after a shrink
  for (;;) {
    report_phase(Phase::kStarting);
    // A spare waits for as long as the job runs; a rank that lost its peers, bounded.
    const std::optional<Assignment> assignment =
        session.await_assignment(after, spare ? std::chrono::hours(24 * 365) : config.timeout);
    if (assignment && assignment->rank < 0) {
      // The world shrank to what the layout fits, without this survivor: it waits as a spare.
      spdlog::info("generation {} has no place for this process: it waits as a spare",
                   assignment->generation);
      after = assignment->generation;
      spare = true;
      continue;
    }
    spare = false;
    if (!assignment) {
      LATTICE_THROW(CommError,
                    "generation {} ended ({}) and the agent assigned no new generation within {} "
                    "ms ---> HINT: the agent's log says why it did not recover the job",
                    after, lost, config.timeout.count());
    }
    session.begin(*assignment);
    const int64_t generation = assignment->generation;
    try {
      GlooOptions options;
      options.rank = assignment->rank;
      options.size = assignment->world;
      options.store_path = store;
      options.secret = secret;
      options.prefix = "gen" + std::to_string(generation) + "/";
      options.hostname = bind_addr;
      options.timeout = config.timeout;
      options.abandon = [&session, generation] {
        return session.assignment().generation > generation;
      };
      const std::shared_ptr<GlooTransport> transport = GlooTransport::create(options);
      // Once the agent has started a newer generation this one is over: a peer whose machine
      // vanished closes no socket, and a call waiting on it would last its whole deadline.
      const std::jthread superseded([&session, transport, generation](std::stop_token stop) {
        while (!stop.stop_requested()) {
          const int64_t newest = session.assignment().generation;
          if (newest > generation) {
            transport->abort(fmt::format("the agent started generation {}", newest));
            return;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      });
      Communicator world(transport, config);
      if (nnodes > 1) {
        // The snapshots' copies to another node travel on a world of their own; it fails with
        // this one, so that a write thread sending to a lost peer is not left waiting.
        std::vector<int32_t> nodes(size_t(world.size()));
        world.all_gather(&node, nodes.data(), 1, DType::kI32, {.algorithm = Algorithm::kRing});
        GlooOptions replica = options;
        replica.prefix += "replica/";
        std::shared_ptr<GlooTransport> copies = GlooTransport::create(replica);
        transport->on_failure([copies] { copies->abort("the generation's world failed"); });
        session.set_replication(std::make_shared<SnapshotReplicator>(
            copies, std::vector<int>(nodes.begin(), nodes.end()), config.timeout));
      }
      body(world, *assignment);
      session.set_replication(nullptr);
      return;
    } catch (const CommError& e) {
      lost = e.what();
    } catch (const TimeoutError& e) {
      lost = e.what();
    }
    session.set_replication(nullptr);
    after = generation;
    spdlog::warn(
        "rank {} of generation {} lost its world and waits for the agent's next generation: {}",
        assignment->rank, generation, lost);
  }
}

}  // namespace lattice
