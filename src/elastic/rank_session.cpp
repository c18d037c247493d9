#include "elastic/rank_session.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace lattice {
namespace {

int64_t parse_variable(const char* name, const char* text) {
  int64_t value = 0;
  const char* end = text + std::char_traits<char>::length(text);
  auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end || value < 0) {
    LATTICE_THROW(ConfigError,
                  "{}='{}' is not a number >= 0 ---> HINT: {} is set by `lattice launch` for the "
                  "ranks it starts; unset it to run without an agent",
                  name, text, name);
  }
  return value;
}

Assignment read_assignment(const RankStatus& status) {
  // The agent stores the generation last: equal before and after, the fields are its.
  for (;;) {
    // The fields are loaded with acquire so that the second load of the generation cannot move
    // before them (what an acquire fence would do; ThreadSanitizer does not model fences, and
    // GCC refuses them under -fsanitize=thread).
    const int64_t generation = status.assigned_generation.load(std::memory_order_acquire);
    Assignment a{.generation = generation,
                 .rank = status.assigned_rank.load(std::memory_order_acquire),
                 .world = status.assigned_world.load(std::memory_order_acquire),
                 .refit = status.assigned_refit.load(std::memory_order_acquire) != 0};
    if (status.assigned_generation.load(std::memory_order_relaxed) == generation) return a;
  }
}

}  // namespace

std::optional<AgentLink> detect_agent_link() {
  const char* dir = std::getenv("LATTICE_AGENT_DIR");
  if (dir == nullptr || *dir == '\0') return std::nullopt;
  const char* status = std::getenv("LATTICE_STATUS_FILE");
  if (status == nullptr || *status == '\0') {
    LATTICE_THROW(ConfigError,
                  "LATTICE_AGENT_DIR is set but LATTICE_STATUS_FILE is not ---> HINT: start ranks "
                  "with `lattice launch --nproc-per-node N -- train ...`");
  }
  return AgentLink{.job_dir = dir, .status_file = status};
}

std::filesystem::path process_status_path(const std::filesystem::path& job_dir, int process) {
  return job_dir / ("process" + std::to_string(process) + ".status");
}

std::filesystem::path snapshot_root(const std::filesystem::path& job_dir) {
  return job_dir / "snapshots";
}

RankSession::RankSession(int static_rank, const ElasticConfig& config)
    : agent_(detect_agent_link()) {
  if (agent_) {
    // A rank never outlives its agent: nothing is left running if the agent dies.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const char* agent_pid = std::getenv("LATTICE_AGENT_PID");
    if (agent_pid != nullptr && parse_variable("LATTICE_AGENT_PID", agent_pid) != ::getppid()) {
      LATTICE_THROW(CommError, "the agent (pid {}) that started this rank process is gone",
                    agent_pid);
    }
    record_ = RankStatusMap::open(agent_->status_file);
  }
  const Assignment first = agent_ ? assignment() : Assignment{.rank = static_rank};
  // Firings count across processes in the agent's job directory, or (under mpirun relaunched by
  // lattice launch: static_relaunch.h) in LATTICE_FAULT_DIR.
  const char* fault_dir = std::getenv("LATTICE_FAULT_DIR");
  faults_ = FaultInjector::from_environment(first.rank, agent_ ? agent_->job_dir
                                                        : fault_dir != nullptr
                                                            ? std::filesystem::path(fault_dir)
                                                            : std::filesystem::path());
  if (!agent_ && !faults_) return;
  std::optional<RankStatusMap> map;
  if (agent_) map = RankStatusMap::open(agent_->status_file);
  const auto interval =
      std::chrono::milliseconds(std::max<int64_t>(1, int64_t(config.heartbeat_interval_s * 1e3)));
  reporter_ = std::make_unique<RankStatusReporter>(std::move(map), first.generation,
                                                   faults_ ? &*faults_ : nullptr, interval);
  set_progress_sink(reporter_.get());
}

RankSession::~RankSession() {
  if (reporter_) set_progress_sink(nullptr);
}

Assignment RankSession::assignment() const {
  return record_ ? read_assignment(**record_) : Assignment{};
}

std::optional<Assignment> RankSession::await_assignment(int64_t after,
                                                        std::chrono::milliseconds timeout) const {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const Assignment a = assignment();
    if (a.generation > after) return a;
    if (std::chrono::steady_clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void RankSession::begin(const Assignment& assignment) {
  generation_ = assignment.generation;
  if (reporter_) reporter_->begin_generation(assignment.generation, assignment.rank);
}

void RankSession::check_current() const {
  if (!record_) return;
  const int64_t newest = assignment().generation;
  if (newest > generation_) {
    LATTICE_THROW(Superseded,
                  "this rank belongs to generation {}, but the agent has started generation {}: "
                  "it may neither join nor commit (fenced)",
                  generation_, newest);
  }
}

std::optional<std::filesystem::path> RankSession::snapshots() const {
  if (!agent_) return std::nullopt;
  return snapshot_root(agent_->job_dir);
}

void RankSession::record_error(std::string_view message) {
  if (reporter_) reporter_->record_error(message);
}

}  // namespace lattice
