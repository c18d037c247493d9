// The per-node agent of `lattice launch` (docs/elastic.md): starts the ranks as processes,
// watches them, and when one fails brings the job back from the newest in-memory snapshot.
//
// A job directory in shared memory (/dev/shm/lattice-<pid>-<n>, mode 0700) holds one status
// record per rank (rank_status.h), the Gloo rendezvous store (store/) and the snapshots the
// ranks write after every step (snapshots/step_N, the checkpoint format: atomic, verified,
// the newest two kept). The directory belongs to the agent: it outlives every rank and is
// removed when the agent ends.
//
// A rank has failed when its process ends with an error or a signal, when its heartbeat is
// older than elastic.heartbeat_timeout_s (killed or stopped), or when it beats but its progress
// (step, phase, collective) is older than elastic.progress_timeout_s (stuck). Recovery keeps
// the survivors: the agent kills the failed process, starts generation g+1 (a store prefix of
// its own, so no rank of an older generation can meet the new world) with a replacement in its
// place — a waiting spare (--spares) or a new process — and assigns every survivor its place
// in it through its status record; the survivors, whose generation ended with the lost peer,
// join the new one in the same process (elastic_rank.h), and every rank restores the newest
// snapshot that all of them committed. A rank that fails more than --max-restarts times is
// dropped instead (the world shrinks, down to --min-ranks; the ranks refit the layout keeping
// the global batch); three failures at one step, or a rank refusing its input, end the job. A
// rank whose compute per step is far above the others' is reported as a straggler, not killed.
//
// On several machines (--nnodes M) there is one agent per node. Agent 0 (--node-rank 0) serves
// the job's store (store_server.h) at --rdzv and is the only one that decides: the others start,
// assign and kill their node's processes on its orders, and report their processes' records to
// it through the store every poll (agent_channel.h). Agent 0 judges every rank as above, and a
// node whose agent stops reporting for elastic.heartbeat_timeout_s is lost with all its ranks. An
// agent that loses agent 0 kills its ranks and ends: the job ends (docs/elastic.md).
#pragma once

#include "core/statistics.h"

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "elastic/agent_channel.h"
#include "elastic/rank_status.h"
#include "elastic/store_server.h"
#include "train/train_config.h"

namespace lattice {

// The exit code of a rank that refused its input (a ConfigError: a layout that does not fit,
// a malformed config): restarting it cannot help.
inline constexpr int kInvalidInputExitCode = 3;

// Whether a rank command carries `flag` ("--resume" or "--resume=auto").
bool has_flag(const std::vector<std::string>& command, std::string_view flag);

// How long a rank may go without progress before it is taken for stuck (docs/elastic.md,
// "Liveness"): elastic.progress_factor times the longest it went without progress over the
// steps it finished (`longest_gap_s`; 0 when it finished none, e.g. in the job's first step),
// at most kStuckShareOfDeadline (train_config.h) of the collective deadline, so that the peers
// waiting for it in a collective do not time out first; and never below
// elastic.progress_timeout_s.
double stuck_limit_s(const ElasticConfig& elastic, double collective_timeout_s,
                     double longest_gap_s);

struct AgentOptions {
  int nproc = 1;       // ranks on each node (the world, on one node)
  int nnodes = 1;      // agents of the job, one per node
  int node_rank = 0;   // this agent's; 0 serves the store and decides
  std::string rdzv;    // HOST:PORT of agent 0's store (--nnodes > 1)
  std::string secret;  // the job's (job_secret.h): the store and every gloo connection ask it
  // The address this node's ranks bind their gloo connections to and advertise (empty: the
  // address this machine reaches --rdzv from, or 127.0.0.1 on one node).
  std::string bind_addr;
  double rdzv_timeout_s = 60;  // how long agent 0 waits for the others, and they for its store
  int spares = 0;              // processes started idle, each to take a failed rank's place
  int max_restarts = 3;        // restarts allowed per rank
  int min_ranks = 1;           // a rank failing more often is dropped while the world stays >= this
  double grace_s = 30;         // SIGTERM: how long the ranks have to checkpoint and exit
  // The rank command after `--`: "train", CONFIG, its flags (`--transport gloo` is added).
  std::vector<std::string> command;
  std::filesystem::path executable;  // the lattice binary the ranks run
  ElasticConfig elastic;             // timeouts, from the command's config
  double collective_timeout_s = 30;  // the command's parallel.timeout_s (or its default)
  std::filesystem::path shm_root = "/dev/shm";
  std::filesystem::path rank_output;  // the ranks' stdout and stderr; empty: the agent's
  int same_step_failures = 3;         // failures at one step that end the job
  // > 0: rank r's process (and any replacement of it) runs on the r-th block of this many of
  // the agent's CPUs (--cores-per-rank); spares keep the agent's. 0: unbound.
  int cores_per_rank = 0;
  // The world sizes the command's layout refits to (TrainConfig::refittable_worlds), ascending;
  // a shrink goes to the largest one the survivors fill, and the survivors beyond it wait as
  // spares. Empty: any.
  std::vector<int> fitting_worlds = {};
};

// One failure the agent saw, for its report and for tests (bench elastic).
struct RankFailure {
  int rank = 0;
  int64_t generation = 0;
  int64_t step = 0;
  std::string cause;            // "killed by signal 9", "stopped: no heartbeat for 1.0 s", ...
  double detected_after_s = 0;  // from the rank's last heartbeat or progress to detection
  std::string report;           // the whole message, every rank's state
  int64_t restored_step = -1;   // the snapshot the next generation restored (0: the start)
  double recovery_s = -1;       // detection to the first step trained after the restore
  int survivors_kept = 0;       // processes of the old generation that joined the new one
  bool replaced_by_spare = false;
};

// A rank reported as a straggler (once per rank and generation).
struct Straggler {
  int rank = 0;
  int64_t step = 0;
  double compute_s = 0;        // its compute in the last step
  double others_median_s = 0;  // the other ranks' median
};

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();  // kills any rank still running, removes the job directory
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end: 0 when every rank of the last generation exited 0. A SIGTERM or
  // SIGINT (core/stop_request.h, installed by the caller) is forwarded to the ranks, which
  // checkpoint and exit within options.grace_s.
  int run();
  const std::vector<RankFailure>& failures() const { return failures_; }
  const std::vector<Straggler>& stragglers() const { return stragglers_; }
  const std::filesystem::path& job_dir() const { return job_dir_; }
  int world() const { return int(ranks_.size()); }  // ranks of the current generation

 private:
  // One process of the job: a rank of the current generation or a waiting spare. Agent 0 keeps
  // the other nodes' too, as their agents last reported them.
  struct Process {
    int id = -1;  // its status record on its node, process<id>.status
    int node = 0;
    pid_t pid = -1;
    std::optional<RankStatusMap> status;  // this node's processes
    ProcessReport report;                 // another node's, as its agent last reported it
    bool exited = false;
    int exit_code = 0;  // when exited normally
    int signal = 0;     // when killed by a signal
    // Straggler watch: the step last looked at, how many steps in a row it was slow.
    int64_t seen_step = -1;
    StragglerStreak slow;
  };

  // Starts a process on `node` (its agent's, when not this one); with `rank` >= 0 it is
  // assigned that rank of the current generation.
  Process spawn(int rank, int node);
  Process spawn_here(int id, int rank, const Assignment& assignment);
  void assign(Process& process, int rank);
  static void write_assignment(RankStatus& status, const Assignment& assignment);
  Assignment assignment_for(int rank) const;
  ProcessReport view(const Process& process) const;
  bool here(const Process& process) const { return process.node == options_.node_rank; }
  // Agent 0 of several: waits for every agent, reads their reports, finds a lost node.
  // Several nodes: agent 0 starts the store; every agent connects to it and says hello.
  void connect_agents();
  void meet_agents();
  void log_refused_clients();
  std::optional<RankFailure> read_reports();
  // The other agents' loop: follow agent 0's orders, report this node's processes.
  int follow();
  // Reaps `process` if it ended; true when it has.
  bool reap(Process& process);
  // Reaps exits and checks liveness; returns the failure of this poll, if any.
  std::optional<RankFailure> poll();
  void watch_stragglers();
  // Starts generation g+1 after `failure`; false when the job must end instead.
  bool recover(RankFailure& failure);
  RankFailure describe(int culprit, const std::string& cause, double detected_after_s) const;
  std::string rank_state(int r) const;
  std::string host_of(const Process& process) const;
  void kill(Process& process);
  void kill_all();
  bool all_exited_ok() const;
  void tell_agents_to_exit(int code);
  // SIGTERM: forward to the ranks, wait for them up to the grace period.
  int terminate();
  void time_recovery();

  AgentOptions options_;
  std::filesystem::path job_dir_;
  std::unique_ptr<StoreServer> store_server_;  // agent 0 of several
  std::unique_ptr<AgentChannel> channel_;      // every agent of several
  std::map<int, NodeState> nodes_;             // agent 0: the other agents, by node
  std::vector<int> cpus_;  // the agent's CPUs, when --cores-per-rank binds the ranks
  int64_t generation_ = 0;
  int next_process_ = 0;
  std::vector<Process> ranks_;   // index: rank in the current generation
  std::vector<Process> spares_;  // started, waiting for an assignment
  std::vector<RankFailure> failures_;
  std::vector<Straggler> stragglers_;
  std::map<int, int> restarts_;           // per rank
  std::map<int64_t, int> step_failures_;  // per step
  // The failure whose recovery is still being timed, and when it was detected.
  std::optional<size_t> recovering_;
  int64_t recovering_since_ns_ = 0;
};

}  // namespace lattice
