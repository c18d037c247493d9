// What a rank process keeps for the agent that watches it (docs/elastic.md).
//
// `lattice launch` starts each rank with LATTICE_AGENT_DIR (the job directory in shared
// memory), LATTICE_RANK and LATTICE_GENERATION. A RankSession opened in that process maps the
// rank's status record, starts its heartbeat, reports progress there, and names the directory
// its in-memory snapshots go to. Without an agent it only fires LATTICE_FAULT's faults (under
// mpirun, one rank per process too); in-process thread ranks open none.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string_view>

#include "elastic/fault_injection.h"
#include "elastic/rank_status.h"
#include "train/train_config.h"

namespace lattice {

struct AgentLink {
  std::filesystem::path job_dir;
  int rank = 0;
  int64_t generation = 0;
};

// The agent's variables, or nullopt when this process was not started by `lattice launch`.
// ConfigError when they are set but malformed.
std::optional<AgentLink> detect_agent_link();

// The files of a job directory (one place for the agent and the ranks).
std::filesystem::path rank_status_path(const std::filesystem::path& job_dir, int rank);
std::filesystem::path snapshot_root(const std::filesystem::path& job_dir);

class RankSession {
 public:
  // `world_rank`: this process's rank. Installs the progress sink when an agent watches the
  // process or LATTICE_FAULT is set.
  RankSession(int world_rank, const ElasticConfig& config);
  ~RankSession();  // removes the sink
  RankSession(const RankSession&) = delete;
  RankSession& operator=(const RankSession&) = delete;

  const std::optional<AgentLink>& agent() const { return agent_; }
  // Where this job's in-memory snapshots live (under an agent).
  std::optional<std::filesystem::path> snapshots() const;
  // Leaves the error that ends this rank in its status record, for the agent's report.
  void record_error(std::string_view message);

 private:
  std::optional<AgentLink> agent_;
  std::optional<FaultInjector> faults_;
  std::unique_ptr<RankStatusReporter> reporter_;
};

}  // namespace lattice
