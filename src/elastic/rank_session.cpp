#include "elastic/rank_session.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <string>

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

}  // namespace

std::optional<AgentLink> detect_agent_link() {
  const char* dir = std::getenv("LATTICE_AGENT_DIR");
  if (dir == nullptr || *dir == '\0') return std::nullopt;
  const char* rank = std::getenv("LATTICE_RANK");
  const char* generation = std::getenv("LATTICE_GENERATION");
  if (rank == nullptr || generation == nullptr) {
    LATTICE_THROW(ConfigError,
                  "LATTICE_AGENT_DIR is set but LATTICE_RANK or LATTICE_GENERATION is not ---> "
                  "HINT: start ranks with `lattice launch --nproc-per-node N -- train ...`");
  }
  return AgentLink{.job_dir = dir,
                   .rank = int(parse_variable("LATTICE_RANK", rank)),
                   .generation = parse_variable("LATTICE_GENERATION", generation)};
}

std::filesystem::path rank_status_path(const std::filesystem::path& job_dir, int rank) {
  return job_dir / ("rank" + std::to_string(rank) + ".status");
}

std::filesystem::path snapshot_root(const std::filesystem::path& job_dir) {
  return job_dir / "snapshots";
}

RankSession::RankSession(int world_rank, const ElasticConfig& config)
    : agent_(detect_agent_link()) {
  if (agent_ && agent_->rank != world_rank) {
    LATTICE_THROW(ConfigError, "the agent started this process as rank {} but it joined as rank {}",
                  agent_->rank, world_rank);
  }
  if (agent_) {
    // A rank never outlives its agent: nothing is left running if the agent dies.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const char* agent_pid = std::getenv("LATTICE_AGENT_PID");
    if (agent_pid != nullptr && parse_variable("LATTICE_AGENT_PID", agent_pid) != ::getppid()) {
      LATTICE_THROW(CommError, "rank {}: the agent (pid {}) that started this rank is gone",
                    world_rank, agent_pid);
    }
  }
  faults_ = FaultInjector::from_environment(world_rank,
                                            agent_ ? agent_->job_dir : std::filesystem::path());
  if (!agent_ && !faults_) return;
  std::optional<RankStatusMap> map;
  if (agent_) map = RankStatusMap::open(rank_status_path(agent_->job_dir, world_rank));
  const auto interval =
      std::chrono::milliseconds(std::max<int64_t>(1, int64_t(config.heartbeat_interval_s * 1e3)));
  reporter_ = std::make_unique<RankStatusReporter>(std::move(map), agent_ ? agent_->generation : 0,
                                                   faults_ ? &*faults_ : nullptr, interval);
  set_progress_sink(reporter_.get());
}

RankSession::~RankSession() {
  if (reporter_) set_progress_sink(nullptr);
}

std::optional<std::filesystem::path> RankSession::snapshots() const {
  if (!agent_) return std::nullopt;
  return snapshot_root(agent_->job_dir);
}

void RankSession::record_error(std::string_view message) {
  if (reporter_) reporter_->record_error(message);
}

}  // namespace lattice
