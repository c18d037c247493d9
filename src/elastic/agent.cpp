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
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ckpt/shard_writer.h"
#include "core/error.h"
#include "core/stop_request.h"
#include "core/thread_budget.h"
#include "elastic/rank_session.h"

extern char** environ;

namespace lattice {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(10);
// How long after one rank's failure the others that ended count as the same failure.
constexpr auto kSimultaneousFailures = std::chrono::milliseconds(50);

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
  if (options_.spares < 0) {
    LATTICE_THROW(ConfigError, "--spares {} must not be negative", options_.spares);
  }
  if (options_.command.empty()) {
    LATTICE_THROW(ConfigError,
                  "lattice launch needs the rank command after `--` ---> HINT: lattice launch "
                  "--nproc-per-node 4 -- train configs/shakespeare-char.toml --dp 4");
  }
  if (options_.min_ranks < 1 || options_.min_ranks > options_.nproc) {
    LATTICE_THROW(ConfigError, "--min-ranks {} must lie in [1, --nproc-per-node {}]",
                  options_.min_ranks, options_.nproc);
  }
  if (options_.cores_per_rank < 0) {
    LATTICE_THROW(ConfigError, "--cores-per-rank {} must not be negative", options_.cores_per_rank);
  }
  if (options_.cores_per_rank > 0) {
    cpus_ = affinity_cpus();
    const int64_t needed = int64_t(options_.nproc) * options_.cores_per_rank;
    if (needed > int64_t(cpus_.size())) {
      LATTICE_THROW(ConfigError,
                    "--cores-per-rank {} x --nproc-per-node {} needs {} cores but this process "
                    "may use {} ---> HINT: lower --cores-per-rank (train.threads per rank) or "
                    "leave it out to let the ranks share the cores",
                    options_.cores_per_rank, options_.nproc, needed, cpus_.size());
    }
  }
  job_dir_ = make_job_dir(options_.shm_root);
  std::filesystem::create_directory(job_dir_ / "store");
  std::filesystem::create_directory(snapshot_root(job_dir_));
}

Agent::~Agent() {
  kill_all();
  std::error_code ec;
  std::filesystem::remove_all(job_dir_, ec);
}

void Agent::assign(Process& process, int rank) {
  RankStatus& s = **process.status;
  s.assigned_rank.store(rank, std::memory_order_relaxed);
  s.assigned_world.store(world(), std::memory_order_relaxed);
  // A world smaller than the command's layout: the ranks refit it (TrainConfig::refit_to_world).
  s.assigned_refit.store(world() != options_.nproc ? 1 : 0, std::memory_order_relaxed);
  s.assigned_generation.store(generation_, std::memory_order_release);
}

Agent::Process Agent::spawn(int rank) {
  std::vector<std::string> args = {options_.executable.string()};
  args.insert(args.end(), options_.command.begin(), options_.command.end());
  if (!has_flag(options_.command, "--transport")) {
    args.push_back("--transport");
    args.push_back("gloo");
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  Process process;
  process.id = next_process_++;
  process.status = RankStatusMap::create(process_status_path(job_dir_, process.id));
  if (rank >= 0) assign(process, rank);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view var(*e);
    if (!var.starts_with("LATTICE_RANK=") && !var.starts_with("LATTICE_LOCAL_RANK=") &&
        !var.starts_with("LATTICE_WORLD_SIZE=") && !var.starts_with("LATTICE_GENERATION=")) {
      env.emplace_back(var);
    }
  }
  env.push_back(fmt::format("LATTICE_AGENT_DIR={}", job_dir_.string()));
  env.push_back(fmt::format("LATTICE_AGENT_PID={}", int(::getpid())));
  env.push_back(fmt::format("LATTICE_STATUS_FILE={}", process.status->path().string()));
  env.push_back(fmt::format("LATTICE_STORE={}", (job_dir_ / "store").string()));
  // Informational: the rank reads its place in each generation from its status record.
  if (rank >= 0) {
    env.push_back(fmt::format("LATTICE_RANK={}", rank));
    env.push_back(fmt::format("LATTICE_LOCAL_RANK={}", rank));
    env.push_back(fmt::format("LATTICE_WORLD_SIZE={}", world()));
    env.push_back(fmt::format("LATTICE_GENERATION={}", generation_));
  }
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
  // The child inherits this thread's CPU mask: rank r's block while it is spawned.
  std::optional<ScopedThreadAffinity> bound;
  if (options_.cores_per_rank > 0 && rank >= 0) {
    const auto first = cpus_.begin() + ptrdiff_t(rank) * options_.cores_per_rank;
    bound.emplace(std::vector<int>(first, first + options_.cores_per_rank));
  }
  const int rc = ::posix_spawn(&process.pid, argv[0], &files, nullptr, argv.data(), envp.data());
  bound.reset();
  posix_spawn_file_actions_destroy(&files);
  if (rc != 0) {
    LATTICE_THROW(IoError, "cannot start a rank process ({}): {}", args[0], std::strerror(rc));
  }
  return process;
}

std::string Agent::rank_state(int r) const {
  const Process& rank = ranks_[size_t(r)];
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

bool Agent::reap(Process& process) {
  if (process.exited) return true;
  int status = 0;
  if (::waitpid(process.pid, &status, WNOHANG) != process.pid) return false;
  process.exited = true;
  if (WIFSIGNALED(status)) process.signal = WTERMSIG(status);
  if (WIFEXITED(status)) process.exit_code = WEXITSTATUS(status);
  return true;
}

std::optional<RankFailure> Agent::poll() {
  const ElasticConfig& e = options_.elastic;
  // A spare that ended is only one fewer spare.
  for (auto it = spares_.begin(); it != spares_.end();) {
    if (!reap(*it)) {
      ++it;
      continue;
    }
    spdlog::warn("agent: spare process {} (pid {}) ended ({}); {} spare(s) left", it->id,
                 int(it->pid),
                 it->signal != 0 ? fmt::format("signal {}", it->signal)
                                 : fmt::format("exit code {}", it->exit_code),
                 spares_.size() - 1);
    it = spares_.erase(it);
  }
  std::optional<int> ended_with_error;  // a rank that exited non-zero
  for (int r = 0; r < world(); ++r) {
    Process& rank = ranks_[size_t(r)];
    if (rank.exited || !reap(rank)) continue;
    if (rank.signal != 0) {
      const int64_t last = (*rank.status)->heartbeat_ns.load();
      return describe(
          r, fmt::format("killed by signal {} ({})", rank.signal, ::strsignal(rank.signal)),
          last != 0 ? seconds_since(last) : 0.0);
    }
    if (rank.exit_code != 0 && !ended_with_error) ended_with_error = r;
  }
  // Liveness of the running ranks: a stopped or dead one first, then a stuck one.
  std::optional<int> stuck;
  int64_t stuck_since = 0;
  bool stuck_waiting = false;
  for (int r = 0; r < world(); ++r) {
    const Process& rank = ranks_[size_t(r)];
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
    // Starting covers a survivor between generations (waiting for its assignment and its
    // peers: bounded by its own rendezvous deadline).
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
    // Its own error (recorded before it exited): a rank that only lost a peer does not exit,
    // it waits for the next generation.
    return describe(*ended_with_error,
                    fmt::format("exited with code {}", ranks_[size_t(*ended_with_error)].exit_code),
                    0.0);
  }
  return std::nullopt;
}

void Agent::watch_stragglers() {
  const double factor = options_.elastic.straggler_factor;
  if (factor <= 0 || world() < 2) return;
  for (int r = 0; r < world(); ++r) {
    Process& rank = ranks_[size_t(r)];
    const RankStatus& s = **rank.status;
    if (rank.exited || s.generation.load() != generation_) continue;
    const int64_t step = s.step.load(std::memory_order_acquire);
    if (step == rank.seen_step) continue;
    rank.seen_step = step;
    const double mine = double(s.last_step_compute_ns.load()) / 1e9;
    std::vector<double> others;
    for (int o = 0; o < world(); ++o) {
      const RankStatus& t = **ranks_[size_t(o)].status;
      const int64_t ns = t.last_step_compute_ns.load();
      if (o != r && ns > 0 && t.generation.load() == generation_)
        others.push_back(double(ns) / 1e9);
    }
    if (mine <= 0 || others.empty()) continue;
    std::nth_element(others.begin(), others.begin() + others.size() / 2, others.end());
    const double median = others[others.size() / 2];
    if (!rank.slow.observe(mine, median, factor)) continue;
    stragglers_.push_back({.rank = r, .step = step, .compute_s = mine, .others_median_s = median});
    spdlog::warn(
        "agent: rank {} (host {}, pid {}) is a straggler: {:.1f} ms of compute per step against "
        "a median of {:.1f} ms on the other ranks ({:.1f}x, above elastic.straggler_factor = {} "
        "for 3 steps, up to step {}); it is not killed, every rank waits for it ---> HINT: look "
        "for another load on its cores (lattice doctor), or set its cores apart",
        r, host_name(), int(rank.pid), 1e3 * mine, 1e3 * median, mine / median, factor, step);
  }
}

void Agent::kill(Process& process) {
  if (process.pid <= 0 || process.exited) return;
  ::kill(process.pid, SIGKILL);
  int status = 0;
  while (::waitpid(process.pid, &status, 0) < 0 && errno == EINTR) {
  }
  process.exited = true;
  process.signal = SIGKILL;
}

void Agent::kill_all() {
  for (Process& p : ranks_) {
    if (p.pid > 0 && !p.exited) ::kill(p.pid, SIGKILL);
  }
  for (Process& p : spares_) {
    if (p.pid > 0 && !p.exited) ::kill(p.pid, SIGKILL);
  }
  for (Process& p : ranks_) kill(p);
  for (Process& p : spares_) kill(p);
}

bool Agent::all_exited_ok() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const Process& r) {
    return r.exited && r.signal == 0 && r.exit_code == 0;
  });
}

int Agent::terminate() {
  spdlog::warn(
      "agent: signal {} received: asking the {} ranks to finish their step and write a "
      "checkpoint (grace {} s)",
      stop_requested(), world(), options_.grace_s);
  for (Process& spare : spares_) kill(spare);  // a spare holds nothing
  for (Process& rank : ranks_) {
    if (!rank.exited) ::kill(rank.pid, SIGTERM);
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(options_.grace_s * 1e3));
  while (std::chrono::steady_clock::now() < deadline) {
    bool running = false;
    for (Process& rank : ranks_) running = !reap(rank) || running;
    if (!running) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  const bool in_time =
      std::all_of(ranks_.begin(), ranks_.end(), [](const Process& r) { return r.exited; });
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
  for (const Process& rank : ranks_) {
    // The record's step is the one being trained: past `restored` once a step completed.
    const RankStatus& s = **rank.status;
    if (rank.exited) continue;
    if (s.generation.load() != generation_ || s.step.load() <= restored) return;
  }
  failures_[*recovering_].recovery_s = double(steady_now_ns() - recovering_since_ns_) / 1e9;
  recovering_.reset();
}

bool Agent::recover(RankFailure& failure) {
  Process& culprit = ranks_[size_t(failure.rank)];
  kill(culprit);  // a stopped or stuck one, too: nothing is left hanging
  if (culprit.signal == 0 && culprit.exit_code == kInvalidInputExitCode) {
    spdlog::error(
        "agent: rank {} refused its input or found a failed check (exit code {}): a restart "
        "would end the same way, so the job ends ---> HINT: fix what its error names",
        failure.rank, kInvalidInputExitCode);
    return false;
  }
  // Every other rank whose process has ended by now failed with this one (a fault that hit
  // several ranks at once, a lost node's ranks): each counts a restart, and those past
  // --max-restarts leave the world together, in one generation.
  // A few poll intervals first: the ranks one fault hits (one node's) end within milliseconds
  // of each other.
  std::this_thread::sleep_for(kSimultaneousFailures);
  std::vector<int> failed = {failure.rank};
  for (int r = 0; r < world(); ++r) {
    Process& other = ranks_[size_t(r)];
    if (r != failure.rank && reap(other) && !(other.signal == 0 && other.exit_code == 0)) {
      failed.push_back(r);
    }
  }
  std::vector<int> dropped;
  int restarts = 0;
  for (int r : failed) {
    const int n = ++restarts_[r];
    if (r == failure.rank) restarts = n;
    if (n > options_.max_restarts) dropped.push_back(r);
  }
  const int at_step = ++step_failures_[failure.step];
  if (!dropped.empty()) {
    if (world() - int(dropped.size()) < options_.min_ranks) {
      spdlog::error(
          "agent: rank(s) {} failed more than --max-restarts {} times, and the world of {} "
          "cannot shrink by {} below --min-ranks {}: the job ends ---> HINT: look at the "
          "ranks' errors above; lower --min-ranks to go on with fewer ranks",
          fmt::join(dropped, ", "), options_.max_restarts, world(), dropped.size(),
          options_.min_ranks);
      return false;
    }
    // Shrink: the world goes on without the failed ranks (the ranks after them move down,
    // refit the layout with the global batch kept, and restore the snapshot resharded).
    std::sort(dropped.begin(), dropped.end());
    const std::string names = fmt::format("{}", fmt::join(dropped, ", "));
    for (auto r = dropped.rbegin(); r != dropped.rend(); ++r) ranks_.erase(ranks_.begin() + *r);
    restarts_.clear();
    step_failures_.clear();
    spdlog::warn(
        "agent: rank(s) {} failed more than --max-restarts {} times: the job goes on with {} "
        "ranks (--min-ranks {})",
        names, options_.max_restarts, world(), options_.min_ranks);
  } else if (at_step >= options_.same_step_failures) {
    spdlog::error(
        "agent: step {} failed {} times (rank {}: {}): the same fault at the same "
        "step would repeat, so the job ends instead of looping ---> HINT: fix what "
        "the error names, then `lattice train ... --resume auto` continues from the "
        "newest checkpoint",
        failure.step, at_step, failure.rank, failure.cause);
    return false;
  }
  ++generation_;
  const std::optional<int64_t> snapshot = CheckpointRoot(snapshot_root(job_dir_)).latest_step();
  failure.restored_step = snapshot.value_or(0);
  // Every slot whose process has ended gets a spare, or a new process; the others are kept.
  std::vector<std::string> members;
  for (int r = 0; r < world(); ++r) {
    Process& slot = ranks_[size_t(r)];
    std::string how;
    if (!slot.exited) {
      assign(slot, r);
      ++failure.survivors_kept;
      how = "kept";
    } else if (!spares_.empty()) {
      slot = std::move(spares_.front());
      spares_.erase(spares_.begin());
      assign(slot, r);
      failure.replaced_by_spare = true;
      how = "a spare";
    } else {
      slot = spawn(r);
      how = "new";
    }
    members.push_back(fmt::format("{} (pid {}, {})", r, int(slot.pid), how));
  }
  spdlog::warn("agent: generation {}: ranks {}; restoring {} (restart {} of rank {}, at most {})",
               generation_, fmt::join(members, ", "),
               snapshot ? fmt::format("the in-memory snapshot of step {}", *snapshot)
                        : std::string("the start (no snapshot yet)"),
               restarts, failure.rank, options_.max_restarts);
  return true;
}

int Agent::run() {
  ranks_.resize(size_t(options_.nproc));  // world() is the generation's size from the start
  for (int r = 0; r < options_.nproc; ++r) ranks_[size_t(r)] = spawn(r);
  for (int s = 0; s < options_.spares; ++s) spares_.push_back(spawn(-1));
  for (;;) {
    std::this_thread::sleep_for(kPollInterval);
    if (stop_requested() != 0) return terminate();
    std::optional<RankFailure> failure = poll();
    if (!failure) {
      time_recovery();
      watch_stragglers();
      if (std::all_of(ranks_.begin(), ranks_.end(), [](const Process& r) { return r.exited; })) {
        for (Process& spare : spares_) kill(spare);
        return all_exited_ok() ? 0 : 1;
      }
      continue;
    }
    spdlog::error("agent: {}", failure->report);
    if (!recover(*failure)) {
      failures_.push_back(*failure);
      kill_all();
      return 1;
    }
    failures_.push_back(*failure);
    recovering_ = failures_.size() - 1;
    recovering_since_ns_ = steady_now_ns();
  }
}

}  // namespace lattice
