// The agents of a multi-node `lattice launch` talk through the job's store (comm/redis_store.h):
// every agent reports its node's processes under agent/<node>/report (overwritten every poll,
// with a sequence number that proves it is alive); agent 0 gives orders to each agent under
// agent/<node>/order/<n> (set once each, applied in order) and beats under agent0/beat. Ages,
// not clock readings, cross machines: the nodes' steady clocks are not one clock.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/redis_store.h"
#include "core/rank_progress.h"
#include "elastic/rank_session.h"

namespace lattice {

// One process as its agent sees it.
struct ProcessReport {
  int id = -1;
  int64_t pid = 0;
  bool exited = false;
  int signal = 0;
  int exit_code = 0;
  int64_t generation = 0;
  int64_t step = 0;
  Phase phase = Phase::kStarting;
  std::string collective_group;
  uint64_t collective_seq = 0;
  int64_t last_step_compute_ns = 0;
  int64_t longest_progress_gap_ns = 0;  // RankStatus's: 0 before the process's first step
  double heartbeat_age_s = -1;          // < 0: no heartbeat yet
  double progress_age_s = 0;
  std::string error;
};

struct NodeReport {
  int64_t seq = 0;
  std::string host;
  std::vector<ProcessReport> processes;
};

// What agent 0 tells another agent to do.
struct AgentOrder {
  enum class Kind { kSpawn, kAssign, kKill, kTerminate, kExit };
  Kind kind = Kind::kSpawn;
  int process = -1;       // the process id (spawn: the one to give the new process)
  Assignment assignment;  // spawn (generation -1: a spare) and assign
  int exit_code = 0;      // exit
};

// Agent 0's view of another agent.
struct NodeState {
  std::string host;
  int64_t seq = -1;
  int64_t seen_ns = 0;  // this agent's clock when `seq` last changed
  bool lost = false;
  NodeReport report;
};

class AgentChannel {
 public:
  AgentChannel(std::unique_ptr<RedisStore> store, int node);

  // Every agent: says it is here (its host), once.
  void hello(const std::string& host);
  std::optional<std::string> hello_of(int node);

  // Another agent: its node's processes, and the next of agent 0's orders.
  void publish(const NodeReport& report);
  std::optional<AgentOrder> next_order();
  std::optional<int64_t> agent0_beat();
  void end();  // after agent 0's exit order, before ending

  // Agent 0.
  std::optional<NodeReport> report_of(int node);
  void order(int node, const AgentOrder& order);
  void beat();
  bool has_ended(int node);
  RedisStore& store() { return *store_; }

 private:
  std::unique_ptr<RedisStore> store_;
  int node_;
  int64_t next_order_ = 0;     // another agent: the next order to read
  std::vector<int64_t> sent_;  // agent 0: orders sent per node
  int64_t beat_ = 0;
};

}  // namespace lattice
