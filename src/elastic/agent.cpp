#include "elastic/agent.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
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

#include "ckpt/collective_async_saver.h"
#include "ckpt/shard_writer.h"
#include "core/error.h"
#include "core/stop_request.h"
#include "core/thread_budget.h"
#include "elastic/job_secret.h"
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

// The address of this machine that `to` is reached from (the route's source address): what this
// node's ranks bind to and advertise. A UDP connect sends nothing.
std::string local_address_towards(const StoreAddress& to) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  const std::string port = std::to_string(to.port);
  if (getaddrinfo(to.host.c_str(), port.c_str(), &hints, &result) != 0 || result == nullptr) {
    LATTICE_THROW(ConfigError, "--rdzv {}: the host '{}' does not resolve", to.text(), to.host);
  }
  std::string address;
  const int fd = ::socket(result->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, result->ai_addr, result->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    char text[NI_MAXHOST] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        getnameinfo(reinterpret_cast<sockaddr*>(&local), length, text, sizeof(text), nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      address = text;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(result);
  if (address.empty()) {
    LATTICE_THROW(ConfigError,
                  "--rdzv {}: this machine has no route to it ---> HINT: give --bind-addr, an "
                  "address of this machine the other nodes reach",
                  to.text());
  }
  return address;
}

}  // namespace

bool has_flag(const std::vector<std::string>& command, std::string_view flag) {
  return std::any_of(command.begin(), command.end(), [&](const std::string& a) {
    return a == flag || a.starts_with(std::string(flag) + "=");
  });
}

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
  if (options_.nnodes < 1 || options_.node_rank < 0 || options_.node_rank >= options_.nnodes) {
    LATTICE_THROW(ConfigError, "--node-rank {} must lie in [0, --nnodes {})", options_.node_rank,
                  options_.nnodes);
  }
  if (options_.nnodes > 1 && options_.rdzv.empty()) {
    LATTICE_THROW(ConfigError,
                  "--nnodes {} needs --rdzv HOST:PORT: agent 0's machine and a free port there, "
                  "where it serves the job's store ---> HINT: the same --rdzv on every node",
                  options_.nnodes);
  }
  const int ranks = options_.nproc * options_.nnodes;
  if (options_.min_ranks < 1 || options_.min_ranks > ranks) {
    LATTICE_THROW(ConfigError, "--min-ranks {} must lie in [1, {}] (--nproc-per-node x --nnodes)",
                  options_.min_ranks, ranks);
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
  if (options_.secret.empty()) options_.secret = make_job_secret();
  try {
    connect_agents();
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(job_dir_, ec);  // a constructor that throws runs no destructor
    throw;
  }
}

void Agent::connect_agents() {
  if (options_.nnodes > 1) {
    const StoreAddress address = parse_store_address(options_.rdzv);
    const auto timeout = std::chrono::milliseconds(int64_t(options_.rdzv_timeout_s * 1e3));
    if (options_.node_rank == 0) {
      store_server_ = std::make_unique<StoreServer>(address, options_.secret, job_dir_, timeout);
    }
    channel_ = std::make_unique<AgentChannel>(
        RedisStore::connect(address, options_.secret, timeout), options_.node_rank);
    if (options_.bind_addr.empty()) options_.bind_addr = local_address_towards(address);
    channel_->hello(host_name());
  }
  if (options_.bind_addr.empty()) options_.bind_addr = "127.0.0.1";
}

Agent::~Agent() {
  kill_all();
  std::error_code ec;
  std::filesystem::remove_all(job_dir_, ec);
}

Assignment Agent::assignment_for(int rank) const {
  // A world smaller than the command's layout: the ranks refit it (TrainConfig::refit_to_world).
  return {.generation = generation_,
          .rank = rank,
          .world = world(),
          .refit = world() != options_.nproc * options_.nnodes};
}

void Agent::write_assignment(RankStatus& s, const Assignment& a) {
  s.assigned_rank.store(a.rank, std::memory_order_relaxed);
  s.assigned_world.store(a.world, std::memory_order_relaxed);
  s.assigned_refit.store(a.refit ? 1 : 0, std::memory_order_relaxed);
  s.assigned_generation.store(a.generation, std::memory_order_release);
}

void Agent::assign(Process& process, int rank) {
  const Assignment a = assignment_for(rank);
  if (here(process)) {
    write_assignment(**process.status, a);
  } else {
    channel_->order(process.node, {.kind = AgentOrder::Kind::kAssign,
                                   .process = process.id,
                                   .assignment = a,
                                   .exit_code = 0});
  }
}

Agent::Process Agent::spawn(int rank, int node) {
  const int id = next_process_++;
  const Assignment a = rank >= 0 ? assignment_for(rank) : Assignment{};
  if (node == options_.node_rank) return spawn_here(id, rank, a);
  channel_->order(
      node, {.kind = AgentOrder::Kind::kSpawn, .process = id, .assignment = a, .exit_code = 0});
  Process process;
  process.id = id;
  process.node = node;
  process.report.id = id;
  process.report.generation = a.generation;
  return process;
}

Agent::Process Agent::spawn_here(int id, int rank, const Assignment& assignment) {
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
  process.id = id;
  process.node = options_.node_rank;
  process.status = RankStatusMap::create(process_status_path(job_dir_, process.id));
  if (rank >= 0) write_assignment(**process.status, assignment);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view var(*e);
    if (!var.starts_with("LATTICE_RANK=") && !var.starts_with("LATTICE_LOCAL_RANK=") &&
        !var.starts_with("LATTICE_WORLD_SIZE=") && !var.starts_with("LATTICE_GENERATION=") &&
        !var.starts_with("LATTICE_JOB_SECRET=") && !var.starts_with("LATTICE_BIND_ADDR=") &&
        !var.starts_with("LATTICE_NODE=") && !var.starts_with("LATTICE_NNODES=")) {
      env.emplace_back(var);
    }
  }
  env.push_back(fmt::format("LATTICE_AGENT_DIR={}", job_dir_.string()));
  env.push_back(fmt::format("LATTICE_AGENT_PID={}", int(::getpid())));
  env.push_back(fmt::format("LATTICE_STATUS_FILE={}", process.status->path().string()));
  env.push_back(fmt::format("LATTICE_STORE={}", channel_ ? parse_store_address(options_.rdzv).text()
                                                         : (job_dir_ / "store").string()));
  // The environment of a process is readable by its user alone (/proc/PID/environ is 0400).
  env.push_back(fmt::format("LATTICE_JOB_SECRET={}", options_.secret));
  env.push_back(fmt::format("LATTICE_BIND_ADDR={}", options_.bind_addr));
  env.push_back(fmt::format("LATTICE_NODE={}", options_.node_rank));
  env.push_back(fmt::format("LATTICE_NNODES={}", options_.nnodes));
  // Informational: the rank reads its place in each generation from its status record.
  if (rank >= 0) {
    env.push_back(fmt::format("LATTICE_RANK={}", rank));
    env.push_back(fmt::format("LATTICE_LOCAL_RANK={}", rank % options_.nproc));
    env.push_back(fmt::format("LATTICE_WORLD_SIZE={}", assignment.world));
    env.push_back(fmt::format("LATTICE_GENERATION={}", assignment.generation));
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
    const auto first = cpus_.begin() + ptrdiff_t(rank % options_.nproc) * options_.cores_per_rank;
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

ProcessReport Agent::view(const Process& process) const {
  if (!here(process)) {
    // Its agent's ages, as of its last report: an agent that stopped reporting is found by
    // read_reports (its node lost) before its ranks' ages could mislead.
    ProcessReport r = process.report;
    r.exited = r.exited || process.exited;
    return r;
  }
  ProcessReport r;
  r.id = process.id;
  r.pid = process.pid;
  r.exited = process.exited;
  r.signal = process.signal;
  r.exit_code = process.exit_code;
  if (!process.status) return r;
  const RankStatus& s = **process.status;
  r.generation = s.generation.load();
  r.step = s.step.load(std::memory_order_acquire);
  r.phase = Phase(s.phase.load());
  r.collective_group = s.collective_group.load();
  r.collective_seq = s.collective_seq.load();
  r.last_step_compute_ns = s.last_step_compute_ns.load();
  r.longest_progress_gap_ns = s.longest_progress_gap_ns.load(std::memory_order_acquire);
  const int64_t heartbeat = s.heartbeat_ns.load();
  r.heartbeat_age_s = heartbeat != 0 ? seconds_since(heartbeat) : -1.0;
  r.progress_age_s = seconds_since(s.progress_ns.load());
  r.error = s.error.load();
  return r;
}

std::string Agent::host_of(const Process& process) const {
  if (here(process)) return host_name();
  const auto node = nodes_.find(process.node);
  return node != nodes_.end() ? node->second.host : std::string("?");
}

std::string Agent::rank_state(int r) const {
  const Process& rank = ranks_[size_t(r)];
  const ProcessReport s = view(rank);
  std::string state;
  if (s.exited) {
    state = s.signal != 0 ? fmt::format("killed by signal {} ({})", s.signal, ::strsignal(s.signal))
                          : fmt::format("exited with code {}", s.exit_code);
  } else {
    state = "running";
  }
  const std::string host = host_of(rank);
  std::string text = fmt::format(
      "rank {} (host {}, pid {}): {}, step {}, phase {}, last collective {}#{}", r, host, s.pid,
      state, s.step, phase_name(s.phase), s.collective_group, s.collective_seq);
  if (s.heartbeat_age_s >= 0) {
    text += fmt::format(", heartbeat {:.2f} s ago, progress {:.2f} s ago", s.heartbeat_age_s,
                        s.progress_age_s);
  }
  if (!s.error.empty()) text += fmt::format("\n      error: {}", s.error);
  return text;
}

RankFailure Agent::describe(int culprit, const std::string& cause, double detected_after_s) const {
  RankFailure failure{.rank = culprit,
                      .generation = generation_,
                      .step = view(ranks_[size_t(culprit)]).step,
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
  if (!here(process)) {
    if (!process.report.exited) return false;
    process.exited = true;
    process.signal = process.report.signal;
    process.exit_code = process.report.exit_code;
    return true;
  }
  int status = 0;
  if (::waitpid(process.pid, &status, WNOHANG) != process.pid) return false;
  process.exited = true;
  if (WIFSIGNALED(status)) process.signal = WTERMSIG(status);
  if (WIFEXITED(status)) process.exit_code = WEXITSTATUS(status);
  return true;
}

void Agent::meet_agents() {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(int64_t(options_.rdzv_timeout_s * 1e3));
  for (int node = 1; node < options_.nnodes; ++node) {
    for (;;) {
      if (const auto host = channel_->hello_of(node)) {
        nodes_[node] = NodeState{
            .host = *host, .seq = -1, .seen_ns = steady_now_ns(), .lost = false, .report = {}};
        break;
      }
      log_refused_clients();
      if (std::chrono::steady_clock::now() >= deadline) {
        std::vector<int> missing;
        for (int n = node; n < options_.nnodes; ++n) {
          if (!channel_->hello_of(n)) missing.push_back(n);
        }
        LATTICE_THROW(CommError,
                      "lattice launch: the agents of node(s) {} did not arrive at {} within {} s "
                      "---> HINT: start `lattice launch --nnodes {} --node-rank K --rdzv {}` on "
                      "every node K, with agent 0's secret",
                      fmt::join(missing, ", "), options_.rdzv, options_.rdzv_timeout_s,
                      options_.nnodes, options_.rdzv);
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }
  spdlog::info("agent: {} agents met at {}", options_.nnodes, options_.rdzv);
}

void Agent::log_refused_clients() {
  for (const std::string& refused : channel_->store().take_refused_clients()) {
    spdlog::error("agent: the job's store refused a connection from {}", refused);
  }
}

std::optional<RankFailure> Agent::read_reports() {
  channel_->beat();
  log_refused_clients();
  for (auto& [node, state] : nodes_) {
    if (state.lost) continue;
    if (const std::optional<NodeReport> report = channel_->report_of(node)) {
      if (report->seq != state.seq) {
        state.seq = report->seq;
        state.seen_ns = steady_now_ns();
        state.report = *report;
      }
    }
    const double silent = seconds_since(state.seen_ns);
    if (silent > options_.elastic.heartbeat_timeout_s) {
      state.lost = true;
      // Every process of the node is gone with it.
      for (auto it = spares_.begin(); it != spares_.end();) {
        it = it->node == node ? spares_.erase(it) : it + 1;
      }
      std::optional<int> first;
      for (int r = 0; r < world(); ++r) {
        Process& p = ranks_[size_t(r)];
        if (p.node != node || p.exited) continue;
        p.exited = true;
        p.signal = SIGKILL;
        p.report.exited = true;
        p.report.signal = SIGKILL;
        if (!first) first = r;
      }
      if (first) {
        return describe(*first,
                        fmt::format("node {} (host {}) lost: its agent sent nothing for {:.2f} s "
                                    "(limit elastic.heartbeat_timeout_s = {} s)",
                                    node, state.host, silent, options_.elastic.heartbeat_timeout_s),
                        silent);
      }
      continue;
    }
    for (Process& p : ranks_) {
      if (p.node != node) continue;
      for (const ProcessReport& r : state.report.processes) {
        if (r.id == p.id) {
          p.report = r;
          p.pid = pid_t(r.pid);
        }
      }
    }
    for (Process& p : spares_) {
      if (p.node != node) continue;
      for (const ProcessReport& r : state.report.processes) {
        if (r.id == p.id) {
          p.report = r;
          p.pid = pid_t(r.pid);
        }
      }
    }
  }
  return std::nullopt;
}

double stuck_limit_s(const ElasticConfig& elastic, double collective_timeout_s,
                     double longest_gap_s) {
  const double cap = kStuckShareOfDeadline * collective_timeout_s;
  const double paced =
      longest_gap_s > 0 ? std::min(elastic.progress_factor * longest_gap_s, cap) : cap;
  return std::max(elastic.progress_timeout_s, paced);
}

std::optional<RankFailure> Agent::poll() {
  const ElasticConfig& e = options_.elastic;
  if (channel_) {
    if (std::optional<RankFailure> lost = read_reports()) return lost;
  }
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
      const ProcessReport s = view(rank);
      return describe(
          r, fmt::format("killed by signal {} ({})", rank.signal, ::strsignal(rank.signal)),
          std::max(s.heartbeat_age_s, 0.0));
    }
    if (rank.exit_code != 0 && !ended_with_error) ended_with_error = r;
  }
  // Liveness of the running ranks: a stopped or dead one first, then a stuck one. A rank that
  // finished no step yet (a replacement) is judged by the pace of the ranks that did.
  int64_t world_gap_ns = 0;
  for (int r = 0; r < world(); ++r) {
    world_gap_ns = std::max(world_gap_ns, view(ranks_[size_t(r)]).longest_progress_gap_ns);
  }
  std::optional<int> stuck;
  double stuck_for = 0;
  double stuck_gap_s = 0;
  bool stuck_waiting = false;
  for (int r = 0; r < world(); ++r) {
    const Process& rank = ranks_[size_t(r)];
    if (rank.exited) continue;
    const ProcessReport s = view(rank);
    if (s.heartbeat_age_s < 0) continue;  // not started yet: the rendezvous timeout covers it
    if (s.heartbeat_age_s > e.heartbeat_timeout_s) {
      return describe(r,
                      fmt::format("no heartbeat for {:.2f} s (stopped or dead; limit "
                                  "elastic.heartbeat_timeout_s = {} s)",
                                  s.heartbeat_age_s, e.heartbeat_timeout_s),
                      s.heartbeat_age_s);
    }
    // Starting covers a survivor between generations (waiting for its assignment and its
    // peers: bounded by its own rendezvous deadline).
    if (s.phase == Phase::kStarting || s.phase == Phase::kFinishing) continue;
    // The rank the others wait for: outside a collective before any in one, then the oldest
    // progress.
    const bool waiting = s.phase == Phase::kCollective;
    if (!stuck || std::pair(waiting, -s.progress_age_s) < std::pair(stuck_waiting, -stuck_for)) {
      stuck = r;
      stuck_for = s.progress_age_s;
      stuck_gap_s =
          double(s.longest_progress_gap_ns > 0 ? s.longest_progress_gap_ns : world_gap_ns) / 1e9;
      stuck_waiting = waiting;
    }
  }
  const double limit = stuck_limit_s(e, options_.collective_timeout_s, stuck_gap_s);
  if (stuck && stuck_for > limit) {
    const std::string basis =
        stuck_gap_s > 0
            ? fmt::format(
                  "max(elastic.progress_timeout_s {} s, min(elastic.progress_factor {} × "
                  "the longest gap in a step {:.2f} s, {} × parallel.timeout_s {} s))",
                  e.progress_timeout_s, e.progress_factor, stuck_gap_s, kStuckShareOfDeadline,
                  options_.collective_timeout_s)
            : fmt::format(
                  "max(elastic.progress_timeout_s {} s, {} × parallel.timeout_s {} s): "
                  "no rank has finished a step yet",
                  e.progress_timeout_s, kStuckShareOfDeadline, options_.collective_timeout_s);
    return describe(*stuck,
                    fmt::format("heartbeat alive but no progress for {:.2f} s (stuck; limit "
                                "{:.2f} s = {})",
                                stuck_for, limit, basis),
                    stuck_for);
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
  std::vector<ProcessReport> views;
  for (const Process& p : ranks_) views.push_back(view(p));
  for (int r = 0; r < world(); ++r) {
    Process& rank = ranks_[size_t(r)];
    const ProcessReport& s = views[size_t(r)];
    if (rank.exited || s.generation != generation_) continue;
    if (s.step == rank.seen_step) continue;
    rank.seen_step = s.step;
    const double mine = double(s.last_step_compute_ns) / 1e9;
    std::vector<double> others;
    for (int o = 0; o < world(); ++o) {
      const ProcessReport& t = views[size_t(o)];
      if (o != r && t.last_step_compute_ns > 0 && t.generation == generation_)
        others.push_back(double(t.last_step_compute_ns) / 1e9);
    }
    if (mine <= 0 || others.empty()) continue;
    // The median of core/statistics, as the progress line's straggler check takes it.
    const double others_median = median(others);
    if (!rank.slow.observe(mine, others_median, factor)) continue;
    stragglers_.push_back(
        {.rank = r, .step = s.step, .compute_s = mine, .others_median_s = others_median});
    spdlog::warn(
        "agent: rank {} (host {}, pid {}) is a straggler: {:.1f} ms of compute per step against "
        "a median of {:.1f} ms on the other ranks ({:.1f}x, above elastic.straggler_factor = {} "
        "for 3 steps, up to step {}); it is not killed, every rank waits for it ---> HINT: look "
        "for another load on its cores (lattice doctor), or set its cores apart",
        r, host_of(rank), s.pid, 1e3 * mine, 1e3 * others_median, mine / others_median, factor,
        s.step);
  }
}

void Agent::kill(Process& process) {
  if (process.exited) return;
  if (!here(process)) {
    const auto node = nodes_.find(process.node);
    if (node != nodes_.end() && !node->second.lost) {
      try {
        channel_->order(process.node, {.kind = AgentOrder::Kind::kKill,
                                       .process = process.id,
                                       .assignment = {},
                                       .exit_code = 0});
      } catch (const CommError& e) {
        spdlog::warn("agent: cannot tell node {}'s agent to kill process {}: {}", process.node,
                     process.id, e.what());
      }
    }
    process.exited = true;
    process.signal = SIGKILL;
    return;
  }
  if (process.pid <= 0) return;
  ::kill(process.pid, SIGKILL);
  int status = 0;
  while (::waitpid(process.pid, &status, 0) < 0 && errno == EINTR) {
  }
  process.exited = true;
  process.signal = SIGKILL;
}

void Agent::kill_all() {
  for (Process& p : ranks_) {
    if (here(p) && p.pid > 0 && !p.exited) ::kill(p.pid, SIGKILL);
  }
  for (Process& p : spares_) {
    if (here(p) && p.pid > 0 && !p.exited) ::kill(p.pid, SIGKILL);
  }
  for (Process& p : ranks_) kill(p);
  for (Process& p : spares_) kill(p);
}

bool Agent::all_exited_ok() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const Process& r) {
    return r.exited && r.signal == 0 && r.exit_code == 0;
  });
}

void Agent::tell_agents_to_exit(int code) {
  if (!channel_ || options_.node_rank != 0) return;
  try {
    for (const auto& [node, state] : nodes_) {
      if (state.lost) continue;
      channel_->order(
          node,
          {.kind = AgentOrder::Kind::kExit, .process = -1, .assignment = {}, .exit_code = code});
    }
    // The store ends with this agent: the others read their order first.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (const auto& [node, state] : nodes_) {
      // A node taken for lost may only have been slow: it is waited for too (bounded).
      while (!channel_->has_ended(node) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(kPollInterval);
      }
    }
  } catch (const CommError& e) {
    spdlog::warn("agent: cannot tell the other agents to end: {}", e.what());
  }
}

int Agent::terminate() {
  spdlog::warn(
      "agent: signal {} received: asking the {} ranks to finish their step and write a "
      "checkpoint (grace {} s)",
      stop_requested(), world(), options_.grace_s);
  for (Process& spare : spares_) kill(spare);  // a spare holds nothing
  for (Process& rank : ranks_) {
    if (here(rank) && !rank.exited) ::kill(rank.pid, SIGTERM);
  }
  for (const auto& [node, state] : nodes_) {
    if (!state.lost) {
      channel_->order(
          node,
          {.kind = AgentOrder::Kind::kTerminate, .process = -1, .assignment = {}, .exit_code = 0});
    }
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(options_.grace_s * 1e3));
  while (std::chrono::steady_clock::now() < deadline) {
    if (channel_) read_reports();
    bool running = false;
    for (Process& rank : ranks_) running = !reap(rank) || running;
    if (!running) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  const bool in_time =
      std::all_of(ranks_.begin(), ranks_.end(), [](const Process& r) { return r.exited; });
  kill_all();
  const int code = in_time && all_exited_ok() ? 0 : 1;
  tell_agents_to_exit(code);
  if (!in_time) {
    spdlog::error(
        "agent: ranks still running after the grace period of {} s were killed ---> "
        "HINT: raise --grace-s",
        options_.grace_s);
  }
  return code;
}

void Agent::time_recovery() {
  if (!recovering_) return;
  const int64_t restored = failures_[*recovering_].restored_step;
  for (const Process& rank : ranks_) {
    // The record's step is the one being trained: past `restored` once a step completed.
    if (rank.exited) continue;
    const ProcessReport s = view(rank);
    if (s.generation != generation_ || s.step <= restored) return;
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
  if (channel_) read_reports();
  auto node_lost = [&](int node) {
    const auto n = nodes_.find(node);
    return n != nodes_.end() && n->second.lost;
  };
  std::vector<int> failed = {failure.rank};
  for (int r = 0; r < world(); ++r) {
    Process& other = ranks_[size_t(r)];
    if (r != failure.rank && reap(other) && !(other.signal == 0 && other.exit_code == 0)) {
      failed.push_back(r);
    }
  }
  // The waiting spares take the failed ranks' places first, those of a lost node's ranks before
  // the others (they can come back nowhere else), then in rank order, as the assignment below
  // gives them. A spare taking a place is not a restart: --max-restarts counts the new
  // processes started for a rank, so a spare is never left idle while a rank is dropped.
  std::sort(failed.begin(), failed.end(), [&](int a, int b) {
    const bool lost_a = node_lost(ranks_[size_t(a)].node),
               lost_b = node_lost(ranks_[size_t(b)].node);
    return lost_a != lost_b ? lost_a : a < b;
  });
  std::vector<int> dropped;
  bool node_gone = false;
  int restarts = restarts_[failure.rank];
  bool spare_for_culprit = false;
  size_t spares_left = spares_.size();
  for (int r : failed) {
    if (spares_left > 0) {
      --spares_left;
      spare_for_culprit = spare_for_culprit || r == failure.rank;
      continue;
    }
    // A lost node's rank can come back only in a spare's process elsewhere.
    if (node_lost(ranks_[size_t(r)].node)) {
      node_gone = true;
      dropped.push_back(r);
      continue;
    }
    const int n = ++restarts_[r];
    if (r == failure.rank) restarts = n;
    if (n > options_.max_restarts) dropped.push_back(r);
  }
  const int at_step = ++step_failures_[failure.step];
  std::vector<int> demoted;  // processes of survivors the smaller world has no place for
  if (!dropped.empty()) {
    const int survivors = world() - int(dropped.size());
    // The largest world the layout refits to (tp × pp whole, the global batch split evenly)
    // that the survivors fill.
    int next = survivors;
    if (!options_.fitting_worlds.empty()) {
      next = 0;
      for (int w : options_.fitting_worlds) next = w <= survivors ? std::max(next, w) : next;
    }
    if (next < options_.min_ranks || next == 0) {
      spdlog::error(
          "agent: rank(s) {} failed more than --max-restarts {} times or lost their node, and "
          "the world of {} cannot shrink by {} below --min-ranks {}{}: the job ends ---> HINT: "
          "look at the ranks' errors above; lower --min-ranks to go on with fewer ranks, or "
          "keep --spares on the other nodes",
          fmt::join(dropped, ", "), options_.max_restarts, world(), dropped.size(),
          options_.min_ranks,
          next == survivors ? std::string()
                            : fmt::format(" (the layout refits to worlds of {} ranks only, and "
                                          "{} survive)",
                                          fmt::join(options_.fitting_worlds, ", "), survivors));
      return false;
    }
    // Shrink: the world goes on without the failed ranks (the ranks after them move down,
    // refit the layout with the global batch kept, and restore the snapshot resharded).
    std::sort(dropped.begin(), dropped.end());
    const std::string names = fmt::format("{}", fmt::join(dropped, ", "));
    for (auto r = dropped.rbegin(); r != dropped.rend(); ++r) ranks_.erase(ranks_.begin() + *r);
    // Beyond the world the layout fits: first the slots whose process ended, then the last
    // survivors, which wait as spares (a tensor- or pipeline-parallel group that lost a member
    // is re-formed from the others; the snapshot reshards).
    for (int r = world() - 1; r >= 0 && world() > next; --r) {
      if (ranks_[size_t(r)].exited) ranks_.erase(ranks_.begin() + r);
    }
    while (world() > next) {
      demoted.push_back(ranks_.back().id);
      spares_.push_back(std::move(ranks_.back()));
      ranks_.pop_back();
    }
    restarts_.clear();
    step_failures_.clear();
    spdlog::warn(
        "agent: rank(s) {} {}: the job goes on with {} ranks (--min-ranks {}){}", names,
        node_gone ? "lost their node or failed too often"
                  : fmt::format("failed more than --max-restarts {} times", options_.max_restarts),
        world(), options_.min_ranks,
        demoted.empty()
            ? std::string()
            : fmt::format("; {} survivor process(es) wait as spares: the layout refits to worlds "
                          "of {} ranks",
                          demoted.size(), fmt::join(options_.fitting_worlds, ", ")));
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
  const std::optional<int64_t> snapshot = newest_restorable_step(snapshot_root(job_dir_));
  failure.restored_step = snapshot.value_or(0);
  // Every slot whose process has ended gets a spare (a lost node's slots first, as counted
  // above), or a new process on its node; the others are kept.
  std::vector<std::string> how(static_cast<size_t>(world()));
  auto take_spare = [&](int r) {
    Process& slot = ranks_[size_t(r)];
    slot = std::move(spares_.front());
    spares_.erase(spares_.begin());
    assign(slot, r);
    failure.replaced_by_spare = true;
    how[size_t(r)] = "a spare";
  };
  for (int r = 0; r < world() && !spares_.empty(); ++r) {
    if (ranks_[size_t(r)].exited && node_lost(ranks_[size_t(r)].node)) take_spare(r);
  }
  std::vector<std::string> members;
  for (int r = 0; r < world(); ++r) {
    Process& slot = ranks_[size_t(r)];
    if (!how[size_t(r)].empty()) {
      // a lost node's slot, given a spare above
    } else if (!slot.exited) {
      assign(slot, r);
      ++failure.survivors_kept;
      how[size_t(r)] = "kept";
    } else if (!spares_.empty()) {
      take_spare(r);
    } else {
      slot = spawn(r, slot.node);
      how[size_t(r)] = "new";
    }
    members.push_back(channel_ ? fmt::format("{} (node {}, process {}, {})", r, slot.node, slot.id,
                                             how[size_t(r)])
                               : fmt::format("{} (pid {}, {})", r, int(slot.pid), how[size_t(r)]));
  }
  // A demoted survivor no slot took is told it is a spare now (rank -1 of this generation).
  for (Process& spare : spares_) {
    if (std::find(demoted.begin(), demoted.end(), spare.id) != demoted.end()) assign(spare, -1);
  }
  spdlog::warn("agent: generation {}: ranks {}; restoring {} ({})", generation_,
               fmt::join(members, ", "),
               snapshot ? fmt::format("the in-memory snapshot of step {}", *snapshot)
                        : std::string("the newest snapshot the ranks hold"),
               spare_for_culprit
                   ? fmt::format("a spare took rank {}'s place, not a restart: {} of at most {}",
                                 failure.rank, restarts, options_.max_restarts)
                   : fmt::format("restart {} of rank {}, at most {}", restarts, failure.rank,
                                 options_.max_restarts));
  return true;
}

int Agent::run() {
  if (channel_ && options_.node_rank != 0) return follow();
  if (channel_) meet_agents();
  // world() is the generation's size from the start; node n holds ranks n*nproc .. +nproc-1.
  ranks_.resize(size_t(options_.nproc * options_.nnodes));
  for (int r = 0; r < world(); ++r) ranks_[size_t(r)] = spawn(r, r / options_.nproc);
  for (int node = 0; node < options_.nnodes; ++node) {
    for (int s = 0; s < options_.spares; ++s) spares_.push_back(spawn(-1, node));
  }
  for (;;) {
    std::this_thread::sleep_for(kPollInterval);
    if (stop_requested() != 0) return terminate();
    std::optional<RankFailure> failure = poll();
    if (!failure) {
      time_recovery();
      watch_stragglers();
      if (std::all_of(ranks_.begin(), ranks_.end(), [](const Process& r) { return r.exited; })) {
        for (Process& spare : spares_) kill(spare);
        const int code = all_exited_ok() ? 0 : 1;
        tell_agents_to_exit(code);
        return code;
      }
      continue;
    }
    spdlog::error("agent: {}", failure->report);
    if (!recover(*failure)) {
      failures_.push_back(*failure);
      kill_all();
      tell_agents_to_exit(1);
      return 1;
    }
    failures_.push_back(*failure);
    recovering_ = failures_.size() - 1;
    recovering_since_ns_ = steady_now_ns();
  }
}

int Agent::follow() {
  std::map<int, Process> processes;  // this node's, by id
  bool terminating = false;
  int64_t agent0_seq = -1;
  int64_t agent0_seen_ns = steady_now_ns();
  NodeReport report;
  report.host = host_name();
  // Agent 0 gone: its store (its child) is gone too, or it stopped beating.
  const double agent0_timeout = std::max(3.0, 3 * options_.elastic.heartbeat_timeout_s);
  auto give_up = [&](const std::string& why) {
    for (auto& [id, p] : processes) kill(p);
    spdlog::error(
        "agent {}: {}: the job ends here ---> HINT: agent 0 ({}) hosts the store and decides; "
        "after it is lost, run the job again with --resume auto from the last durable "
        "checkpoint (docs/elastic.md)",
        options_.node_rank, why, options_.rdzv);
    return 1;
  };
  for (;;) {
    std::this_thread::sleep_for(kPollInterval);
    if (stop_requested() != 0 && !terminating) {
      terminating = true;
      for (auto& [id, p] : processes) {
        if (!p.exited) ::kill(p.pid, SIGTERM);
      }
    }
    try {
      while (std::optional<AgentOrder> order = channel_->next_order()) {
        switch (order->kind) {
          case AgentOrder::Kind::kSpawn:
            processes[order->process] =
                spawn_here(order->process, order->assignment.rank, order->assignment);
            break;
          case AgentOrder::Kind::kAssign:
            if (auto it = processes.find(order->process); it != processes.end()) {
              write_assignment(**it->second.status, order->assignment);
            }
            break;
          case AgentOrder::Kind::kKill:
            if (auto it = processes.find(order->process); it != processes.end()) kill(it->second);
            break;
          case AgentOrder::Kind::kTerminate:
            terminating = true;
            for (auto& [id, p] : processes) {
              if (!p.exited) ::kill(p.pid, SIGTERM);
            }
            break;
          case AgentOrder::Kind::kExit:
            for (auto& [id, p] : processes) kill(p);
            channel_->end();
            return order->exit_code;
        }
      }
      report.processes.clear();
      for (auto& [id, p] : processes) {
        reap(p);
        report.processes.push_back(view(p));
      }
      ++report.seq;
      channel_->publish(report);
      const std::optional<int64_t> beat = channel_->agent0_beat();
      if (beat && *beat != agent0_seq) {
        agent0_seq = *beat;
        agent0_seen_ns = steady_now_ns();
      }
    } catch (const CommError& e) {
      // Every rank this node ran finished its work: agent 0 ended the job before this agent
      // read its last order (its store ends with it).
      const bool finished =
          !processes.empty() && std::all_of(processes.begin(), processes.end(), [&](auto& p) {
            return reap(p.second) && p.second.signal == 0 && p.second.exit_code == 0;
          });
      if (finished) {
        spdlog::info("agent {}: the job's store closed after this node's ranks finished",
                     options_.node_rank);
        return 0;
      }
      return give_up(fmt::format("the job's store failed: {}", e.what()));
    }
    if (seconds_since(agent0_seen_ns) > agent0_timeout) {
      return give_up(
          fmt::format("agent 0 sent nothing for {:.1f} s", seconds_since(agent0_seen_ns)));
    }
  }
}

}  // namespace lattice
