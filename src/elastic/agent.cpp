#include "elastic/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ckpt/shard_writer.h"
#include "core/error.h"
#include "core/stop_request.h"
#include "elastic/rank_session.h"

extern char** environ;

namespace lattice {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(10);

double seconds_since(int64_t ns) {
  return double(steady_now_ns() - ns) / 1e9;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

std::filesystem::path make_job_dir(const std::filesystem::path& root) {
  for (int n = 0;; ++n) {
    const std::filesystem::path dir = root / fmt::format("lattice-{}-{}", int(::getpid()), n);
    std::error_code ec;
    if (std::filesystem::create_directory(dir, ec)) {
      std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::replace);
      return dir;
    }
    if (ec) {
      LATTICE_THROW(IoError,
                    "cannot create the job directory {}: {} ---> HINT: the agent keeps its ranks' "
                    "status and snapshots in shared memory; check that {} exists and is writable",
                    dir.string(), ec.message(), root.string());
    }
  }
}

bool has_flag(const std::vector<std::string>& command, std::string_view flag) {
  return std::any_of(command.begin(), command.end(), [&](const std::string& a) {
    return a == flag || a.starts_with(std::string(flag) + "=");
  });
}

}  // namespace

Agent::Agent(AgentOptions options) : options_(std::move(options)) {
  if (options_.nproc < 1) {
    LATTICE_THROW(ConfigError, "--nproc-per-node {} ---> HINT: start at least one rank",
                  options_.nproc);
  }
  if (options_.command.empty()) {
    LATTICE_THROW(ConfigError,
                  "lattice launch needs the rank command after `--` ---> HINT: lattice launch "
                  "--nproc-per-node 4 -- train configs/shakespeare-char.toml --dp 4");
  }
  job_dir_ = make_job_dir(options_.shm_root);
  std::filesystem::create_directory(job_dir_ / "store");
  std::filesystem::create_directory(snapshot_root(job_dir_));
  if (options_.min_ranks < 1 || options_.min_ranks > options_.nproc) {
    LATTICE_THROW(ConfigError, "--min-ranks {} must lie in [1, --nproc-per-node {}]",
                  options_.min_ranks, options_.nproc);
  }
  ranks_.resize(size_t(options_.nproc));
}

Agent::~Agent() {
  kill_all();
  std::error_code ec;
  std::filesystem::remove_all(job_dir_, ec);
}

void Agent::start_generation() {
  std::vector<std::string> args = {options_.executable.string()};
  args.insert(args.end(), options_.command.begin(), options_.command.end());
  if (!has_flag(options_.command, "--transport")) {
    args.push_back("--transport");
    args.push_back("gloo");
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  for (int r = 0; r < world(); ++r) {
    Rank& rank = ranks_[size_t(r)];
    rank = Rank{};
    rank.status = RankStatusMap::create(rank_status_path(job_dir_, r));
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (!std::string_view(*e).starts_with("LATTICE_RANK=")) env.emplace_back(*e);
    }
    env.push_back(fmt::format("LATTICE_AGENT_DIR={}", job_dir_.string()));
    env.push_back(fmt::format("LATTICE_AGENT_PID={}", int(::getpid())));
    env.push_back(fmt::format("LATTICE_RANK={}", r));
    env.push_back(fmt::format("LATTICE_LOCAL_RANK={}", r));
    env.push_back(fmt::format("LATTICE_WORLD_SIZE={}", world()));
    // A world smaller than the command's layout: the ranks refit it (TrainConfig::refit_to_world).
    if (world() != options_.nproc) env.push_back("LATTICE_REFIT_WORLD=1");
    env.push_back(fmt::format("LATTICE_GENERATION={}", generation_));
    env.push_back(fmt::format("LATTICE_STORE={}", (job_dir_ / "store").string()));
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    if (!options_.rank_output.empty()) {
      posix_spawn_file_actions_addopen(&files, 1, options_.rank_output.c_str(),
                                       O_WRONLY | O_CREAT | O_APPEND, 0600);
      posix_spawn_file_actions_adddup2(&files, 1, 2);
    }
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, argv[0], &files, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&files);
    if (rc != 0) {
      kill_all();
      LATTICE_THROW(IoError, "cannot start rank {} ({}): {}", r, args[0], std::strerror(rc));
    }
    rank.pid = pid;
  }
}

std::string Agent::rank_state(int r) const {
  const Rank& rank = ranks_[size_t(r)];
  const RankStatus& s = **rank.status;
  std::string state;
  if (rank.exited) {
    state = rank.signal != 0
                ? fmt::format("killed by signal {} ({})", rank.signal, ::strsignal(rank.signal))
                : fmt::format("exited with code {}", rank.exit_code);
  } else {
    state = "running";
  }
  const int64_t heartbeat = s.heartbeat_ns.load();
  std::string text = fmt::format(
      "rank {} (host {}, pid {}): {}, step {}, phase {}, last collective {}#{}", r, host_name(),
      int(rank.pid), state, s.step.load(), phase_name(Phase(s.phase.load())),
      s.collective_group.load(), s.collective_seq.load());
  if (heartbeat != 0) {
    text += fmt::format(", heartbeat {:.2f} s ago, progress {:.2f} s ago", seconds_since(heartbeat),
                        seconds_since(s.progress_ns.load()));
  }
  const std::string error = s.error.load();
  if (!error.empty()) text += fmt::format("\n      error: {}", error);
  return text;
}

RankFailure Agent::describe(int culprit, const std::string& cause, double detected_after_s) const {
  RankFailure failure{.rank = culprit,
                      .generation = generation_,
                      .step = (*ranks_[size_t(culprit)].status)->step.load(),
                      .cause = cause,
                      .detected_after_s = detected_after_s,
                      .report = {}};
  failure.report = fmt::format(
      "rank {} failed in generation {} at step {}: {} (detected {:.2f} s "
      "after its last sign of life)",
      culprit, generation_, failure.step, cause, detected_after_s);
  for (int r = 0; r < world(); ++r) failure.report += "\n    " + rank_state(r);
  return failure;
}

std::optional<RankFailure> Agent::poll() {
  const ElasticConfig& e = options_.elastic;
  std::optional<int> ended_with_error;  // a rank that exited non-zero (perhaps for a peer)
  for (int r = 0; r < world(); ++r) {
    Rank& rank = ranks_[size_t(r)];
    if (rank.exited) continue;
    int status = 0;
    const pid_t got = ::waitpid(rank.pid, &status, WNOHANG);
    if (got == rank.pid) {
      rank.exited = true;
      if (WIFSIGNALED(status)) {
        rank.signal = WTERMSIG(status);
        const int64_t last = (*rank.status)->heartbeat_ns.load();
        return describe(
            r, fmt::format("killed by signal {} ({})", rank.signal, ::strsignal(rank.signal)),
            last != 0 ? seconds_since(last) : 0.0);
      }
      rank.exit_code = WEXITSTATUS(status);
      if (rank.exit_code != 0 && !ended_with_error) ended_with_error = r;
    }
  }
  // Liveness of the running ranks: a stopped or dead one first, then a stuck one.
  std::optional<int> stuck;
  int64_t stuck_since = 0;
  bool stuck_waiting = false;
  for (int r = 0; r < world(); ++r) {
    const Rank& rank = ranks_[size_t(r)];
    if (rank.exited) continue;
    const RankStatus& s = **rank.status;
    const int64_t heartbeat = s.heartbeat_ns.load();
    if (heartbeat == 0) continue;  // not started yet: the rendezvous timeout covers it
    if (seconds_since(heartbeat) > e.heartbeat_timeout_s) {
      return describe(r,
                      fmt::format("no heartbeat for {:.2f} s (stopped or dead; limit "
                                  "elastic.heartbeat_timeout_s = {} s)",
                                  seconds_since(heartbeat), e.heartbeat_timeout_s),
                      seconds_since(heartbeat));
    }
    const Phase phase = Phase(s.phase.load());
    if (phase == Phase::kStarting || phase == Phase::kFinishing) continue;
    // The rank the others wait for: outside a collective before any in one, then the oldest
    // progress.
    const int64_t progress = s.progress_ns.load();
    const bool waiting = phase == Phase::kCollective;
    if (!stuck || std::pair(waiting, progress) < std::pair(stuck_waiting, stuck_since)) {
      stuck = r;
      stuck_since = progress;
      stuck_waiting = waiting;
    }
  }
  if (stuck && seconds_since(stuck_since) > e.progress_timeout_s) {
    return describe(*stuck,
                    fmt::format("heartbeat alive but no progress for {:.2f} s (stuck; limit "
                                "elastic.progress_timeout_s = {} s)",
                                seconds_since(stuck_since), e.progress_timeout_s),
                    seconds_since(stuck_since));
  }
  if (ended_with_error) {
    // Its own error (recorded before it exited): the collective deadline is above the progress
    // timeout, so a rank that only waited for a failed peer is not the first one seen.
    return describe(*ended_with_error,
                    fmt::format("exited with code {}", ranks_[size_t(*ended_with_error)].exit_code),
                    0.0);
  }
  return std::nullopt;
}

void Agent::kill_all() {
  for (Rank& rank : ranks_) {
    if (rank.pid > 0 && !rank.exited) ::kill(rank.pid, SIGKILL);
  }
  for (Rank& rank : ranks_) {
    if (rank.pid > 0 && !rank.exited) {
      int status = 0;
      while (::waitpid(rank.pid, &status, 0) < 0 && errno == EINTR) {
      }
      rank.exited = true;
      rank.signal = SIGKILL;
    }
  }
}

bool Agent::all_exited_ok() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [](const Rank& r) { return r.exited && r.signal == 0 && r.exit_code == 0; });
}

int Agent::terminate() {
  spdlog::warn(
      "agent: signal {} received: asking the {} ranks to finish their step and write a "
      "checkpoint (grace {} s)",
      stop_requested(), world(), options_.grace_s);
  for (Rank& rank : ranks_) {
    if (!rank.exited) ::kill(rank.pid, SIGTERM);
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(options_.grace_s * 1e3));
  while (std::chrono::steady_clock::now() < deadline) {
    bool running = false;
    for (Rank& rank : ranks_) {
      if (rank.exited) continue;
      int status = 0;
      if (::waitpid(rank.pid, &status, WNOHANG) == rank.pid) {
        rank.exited = true;
        if (WIFSIGNALED(status)) rank.signal = WTERMSIG(status);
        if (WIFEXITED(status)) rank.exit_code = WEXITSTATUS(status);
      } else {
        running = true;
      }
    }
    if (!running) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  const bool in_time =
      std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.exited; });
  kill_all();
  if (!in_time) {
    spdlog::error(
        "agent: ranks still running after the grace period of {} s were killed ---> "
        "HINT: raise --grace-s",
        options_.grace_s);
    return 1;
  }
  return all_exited_ok() ? 0 : 1;
}

void Agent::time_recovery() {
  if (!recovering_) return;
  const int64_t restored = failures_[*recovering_].restored_step;
  for (const Rank& rank : ranks_) {
    // The record's step is the one being trained: past `restored` once a step completed.
    if (!rank.exited && (*rank.status)->step.load() <= restored) return;
  }
  failures_[*recovering_].recovery_s = double(steady_now_ns() - recovering_since_ns_) / 1e9;
  recovering_.reset();
}

int Agent::run() {
  start_generation();
  for (;;) {
    std::this_thread::sleep_for(kPollInterval);
    if (stop_requested() != 0) return terminate();
    std::optional<RankFailure> failure = poll();
    if (!failure) {
      time_recovery();
      if (std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.exited; })) {
        return all_exited_ok() ? 0 : 1;
      }
      continue;
    }
    kill_all();
    failures_.push_back(*failure);
    spdlog::error("agent: {}", failure->report);
    if (ranks_[size_t(failure->rank)].exit_code == kInvalidInputExitCode) {
      spdlog::error(
          "agent: rank {} refused its input (exit code {}): a restart would refuse it "
          "again, so the job ends ---> HINT: fix what its error names",
          failure->rank, kInvalidInputExitCode);
      return 1;
    }
    const int restarts = ++restarts_[failure->rank];
    const int at_step = ++step_failures_[failure->step];
    if (restarts > options_.max_restarts) {
      if (world() - 1 < options_.min_ranks) {
        spdlog::error(
            "agent: rank {} failed {} times, more than --max-restarts {}, and the world "
            "of {} cannot shrink below --min-ranks {}: the job ends ---> HINT: look at "
            "the rank's error above; lower --min-ranks to go on with fewer ranks",
            failure->rank, restarts, options_.max_restarts, world(), options_.min_ranks);
        return 1;
      }
      // Shrink: the world goes on without the failing rank's slot (the ranks refit the layout,
      // the global batch kept, and restore the snapshot resharded onto it).
      ranks_.pop_back();
      restarts_.clear();
      step_failures_.clear();
      spdlog::warn(
          "agent: rank {} failed {} times, more than --max-restarts {}: the job goes on "
          "with {} ranks (--min-ranks {})",
          failure->rank, restarts, options_.max_restarts, world(), options_.min_ranks);
    } else if (at_step >= options_.same_step_failures) {
      spdlog::error(
          "agent: step {} failed {} times (rank {}: {}): the same fault at the same "
          "step would repeat, so the job ends instead of looping ---> HINT: fix what "
          "the error names, then `lattice train ... --resume auto` continues from the "
          "newest checkpoint",
          failure->step, at_step, failure->rank, failure->cause);
      return 1;
    }
    ++generation_;
    const std::optional<int64_t> snapshot = CheckpointRoot(snapshot_root(job_dir_)).latest_step();
    failures_.back().restored_step = snapshot.value_or(0);
    recovering_ = failures_.size() - 1;
    recovering_since_ns_ = steady_now_ns();
    spdlog::warn(
        "agent: generation {}: restarting {} ranks from {} (restart {} of rank {}, at "
        "most {})",
        generation_, world(),
        snapshot ? fmt::format("the in-memory snapshot of step {}", *snapshot)
                 : std::string("the start (no snapshot yet)"),
        restarts, failure->rank, options_.max_restarts);
    start_generation();
  }
}

}  // namespace lattice
