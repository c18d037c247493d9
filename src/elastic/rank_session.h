// What a rank process keeps for the agent that watches it (docs/elastic.md).
//
// `lattice launch` starts each rank process with LATTICE_AGENT_DIR (the job directory in shared
// memory) and LATTICE_STATUS_FILE (its status record there). A RankSession opened in that
// process maps the record, starts its heartbeat, reports progress there, reads the agent's
// assignments (which generation to join, as which rank of how many) and names the directory
// the in-memory snapshots go to. The process outlives its generations: after a lost peer it
// waits for the next assignment and joins again (elastic_rank.h). Without an agent it only
// fires LATTICE_FAULT's faults (under mpirun, one rank per process too); in-process thread
// ranks open none.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string_view>

#include "elastic/fault_injection.h"
#include "elastic/rank_status.h"
#include "elastic/snapshot_replica.h"
#include "train/train_config.h"

namespace lattice {

struct AgentLink {
  std::filesystem::path job_dir;
  std::filesystem::path status_file;
};

// Which generation a rank process is to join, as which rank of how many.
struct Assignment {
  int64_t generation = -1;
  int rank = -1;
  int world = 0;
  bool refit = false;  // the world is smaller than the command's layout: refit it
};

// The agent's variables, or nullopt when this process was not started by `lattice launch`.
// ConfigError when they are set but malformed.
std::optional<AgentLink> detect_agent_link();

// The files of a job directory (one place for the agent and the ranks). Status records are
// named by process (the n-th the agent started), not by rank: a process keeps its record when
// a shrink renumbers it.
std::filesystem::path process_status_path(const std::filesystem::path& job_dir, int process);
std::filesystem::path snapshot_root(const std::filesystem::path& job_dir);

// Thrown by a rank whose generation the agent has replaced (fencing: it may neither join the
// new world nor commit a snapshot into it).
class Superseded : public CommError {
  using CommError::CommError;
};

class RankSession {
 public:
  // Installs the progress sink when an agent watches the process or LATTICE_FAULT is set.
  // `static_rank`: this process's rank when no agent assigns one (under mpirun).
  RankSession(int static_rank, const ElasticConfig& config);
  ~RankSession();  // removes the sink
  RankSession(const RankSession&) = delete;
  RankSession& operator=(const RankSession&) = delete;

  const std::optional<AgentLink>& agent() const { return agent_; }
  // Under an agent: waits (heartbeat going) for an assignment of a generation after `after`;
  // nullopt when `timeout` passes first.
  std::optional<Assignment> await_assignment(int64_t after,
                                             std::chrono::milliseconds timeout) const;
  // The agent's newest assignment (generation -1 before the first).
  Assignment assignment() const;
  // Joins the assignment's generation: the record says so, faults fire for its rank.
  void begin(const Assignment& assignment);
  int64_t generation() const { return generation_; }
  // Throws Superseded when the agent has assigned a generation after this rank's.
  void check_current() const;
  // Where this job's in-memory snapshots live (under an agent).
  std::optional<std::filesystem::path> snapshots() const;
  // Several nodes: how this generation's snapshots reach another node (set by
  // run_elastic_rank for the generation it runs; null on one node).
  void set_replication(std::shared_ptr<const SnapshotReplicator> replication) {
    replication_ = std::move(replication);
  }
  const SnapshotReplicator* replication() const { return replication_.get(); }
  // Leaves the error that ends this rank in its status record, for the agent's report.
  void record_error(std::string_view message);

 private:
  std::optional<AgentLink> agent_;
  std::optional<RankStatusMap> record_;  // the agent's assignments (the reporter writes its own)
  std::optional<FaultInjector> faults_;
  std::unique_ptr<RankStatusReporter> reporter_;
  int64_t generation_ = 0;
  std::shared_ptr<const SnapshotReplicator> replication_;
};

}  // namespace lattice
