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
// (step, phase, collective) is older than elastic.progress_timeout_s (stuck). Recovery today
// restarts the whole world under the next generation (a store prefix of its own, so no rank of
// an older generation can meet the new one): every rank restores the newest snapshot that all
// of them committed and goes on. A rank that fails more than --max-restarts times is dropped
// (the world shrinks, down to --min-ranks; the ranks refit the layout keeping the global
// batch); three failures at one step, or a rank refusing its input, end the job.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "elastic/rank_status.h"
#include "train/train_config.h"

namespace lattice {

// The exit code of a rank that refused its input (a ConfigError: a layout that does not fit,
// a malformed config): restarting it cannot help.
inline constexpr int kInvalidInputExitCode = 3;

struct AgentOptions {
  int nproc = 1;         // ranks on this node (the world, on one node)
  int max_restarts = 3;  // restarts allowed per rank
  int min_ranks = 1;     // a rank failing more often is dropped while the world stays >= this
  double grace_s = 30;   // SIGTERM: how long the ranks have to checkpoint and exit
  // The rank command after `--`: "train", CONFIG, its flags (`--transport gloo` is added).
  std::vector<std::string> command;
  std::filesystem::path executable;  // the lattice binary the ranks run
  ElasticConfig elastic;             // timeouts, from the command's config
  std::filesystem::path shm_root = "/dev/shm";
  std::filesystem::path rank_output;  // the ranks' stdout and stderr; empty: the agent's
  int same_step_failures = 3;         // failures at one step that end the job
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
  const std::filesystem::path& job_dir() const { return job_dir_; }
  int world() const { return int(ranks_.size()); }  // ranks of the current generation

 private:
  struct Rank {
    pid_t pid = -1;
    std::optional<RankStatusMap> status;
    bool exited = false;
    int exit_code = 0;  // when exited normally
    int signal = 0;     // when killed by a signal
  };

  void start_generation();
  // Reaps exits and checks liveness; returns the failure of this poll, if any.
  std::optional<RankFailure> poll();
  RankFailure describe(int culprit, const std::string& cause, double detected_after_s) const;
  std::string rank_state(int r) const;
  void kill_all();
  bool all_exited_ok() const;
  // SIGTERM: forward to the ranks, wait for them up to the grace period.
  int terminate();

  AgentOptions options_;
  std::filesystem::path job_dir_;
  int64_t generation_ = 0;
  std::vector<Rank> ranks_;
  std::vector<RankFailure> failures_;
  std::map<int, int> restarts_;           // per rank
  std::map<int64_t, int> step_failures_;  // per step
  // The failure whose recovery is still being timed, and when it was detected.
  std::optional<size_t> recovering_;
  int64_t recovering_since_ns_ = 0;
  void time_recovery();
};

}  // namespace lattice
