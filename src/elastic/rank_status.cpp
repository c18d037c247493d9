#include "elastic/rank_status.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <utility>

#include "core/error.h"
#include "elastic/fault_injection.h"

namespace lattice {
namespace {

RankStatus* map_record(const std::filesystem::path& path, int fd) {
  void* p = ::mmap(nullptr, sizeof(RankStatus), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    LATTICE_THROW(IoError, "cannot map the rank status record {}: {}", path.string(),
                  std::strerror(err));
  }
  return static_cast<RankStatus*>(p);
}

}  // namespace

template <size_t Words>
void AtomicText<Words>::store(std::string_view text) {
  const size_t n = std::min(Words * 8 - 1, text.size());
  for (size_t w = 0; w < Words; ++w) {
    uint64_t word = 0;
    for (size_t b = 0; b < 8; ++b) {
      const size_t i = w * 8 + b;
      if (i < n) word |= uint64_t(uint8_t(text[i])) << (8 * b);
    }
    words[w].store(word, std::memory_order_relaxed);
    if ((w + 1) * 8 > n) break;  // this word holds the terminating NUL
  }
}

template <size_t Words>
std::string AtomicText<Words>::load() const {
  std::string text;
  for (size_t w = 0; w < Words; ++w) {
    const uint64_t word = words[w].load(std::memory_order_relaxed);
    for (size_t b = 0; b < 8; ++b) {
      const char c = char((word >> (8 * b)) & 0xff);
      if (c == '\0' || text.size() == Words * 8 - 1) return text;
      text.push_back(c);
    }
  }
  return text;
}

template struct AtomicText<8>;
template struct AtomicText<56>;

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

RankStatusMap RankStatusMap::create(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ::ftruncate(fd, sizeof(RankStatus)) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    LATTICE_THROW(IoError, "cannot create the rank status record {}: {}", path.string(),
                  std::strerror(err));
  }
  RankStatus* status = new (map_record(path, fd)) RankStatus();
  return RankStatusMap(path, status);
}

RankStatusMap RankStatusMap::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDWR);
  if (fd < 0) {
    LATTICE_THROW(IoError,
                  "cannot open the rank status record {}: {} ---> HINT: ranks of an elastic run "
                  "are started by `lattice launch`, which creates it",
                  path.string(), std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || size_t(st.st_size) < sizeof(RankStatus)) {
    ::close(fd);
    LATTICE_THROW(IoError, "{} is not a rank status record (size {})", path.string(),
                  int64_t(st.st_size));
  }
  RankStatus* status = map_record(path, fd);
  if (status->magic != RankStatus::kMagic) {
    ::munmap(status, sizeof(RankStatus));
    LATTICE_THROW(IoError, "{} is not a rank status record (bad magic)", path.string());
  }
  return RankStatusMap(path, status);
}

RankStatusMap::~RankStatusMap() {
  if (status_ != nullptr) ::munmap(status_, sizeof(RankStatus));
}

RankStatusMap::RankStatusMap(RankStatusMap&& other) noexcept
    : path_(std::move(other.path_)), status_(std::exchange(other.status_, nullptr)) {}

RankStatusMap& RankStatusMap::operator=(RankStatusMap&& other) noexcept {
  if (this != &other) {
    if (status_ != nullptr) ::munmap(status_, sizeof(RankStatus));
    path_ = std::move(other.path_);
    status_ = std::exchange(other.status_, nullptr);
  }
  return *this;
}

RankStatusReporter::RankStatusReporter(std::optional<RankStatusMap> map, int64_t generation,
                                       FaultInjector* faults,
                                       std::chrono::milliseconds heartbeat_interval)
    : map_(std::move(map)), faults_(faults), heartbeat_interval_(heartbeat_interval) {
  if (!map_) return;
  RankStatus& status = **map_;
  status.pid.store(::getpid());
  status.generation.store(generation);
  status.phase.store(uint32_t(Phase::kStarting));
  touch();
  status.heartbeat_ns.store(steady_now_ns(), std::memory_order_release);
  heartbeat_ = std::thread([this, &status] {
    while (!stopping_.load(std::memory_order_acquire)) {
      status.heartbeat_ns.store(steady_now_ns(), std::memory_order_release);
      std::this_thread::sleep_for(heartbeat_interval_);
    }
  });
}

RankStatusReporter::~RankStatusReporter() {
  stopping_.store(true, std::memory_order_release);
  if (heartbeat_.joinable()) heartbeat_.join();
}

void RankStatusReporter::on_step(int64_t step) {
  training_thread_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  // A step was trained since the last report only when the number moved on: a recovery
  // reports the restored step before training it.
  const bool step_trained = step > step_.exchange(step, std::memory_order_relaxed);
  if (map_) {
    RankStatus& status = **map_;
    const int64_t now = steady_now_ns();
    note_training_progress(now);
    const int64_t started = status.step_started_ns.exchange(now);
    if (started != 0) {
      status.last_step_ns.store(now - started, std::memory_order_relaxed);
      status.last_step_compute_ns.store(
          std::max<int64_t>(0, now - started - collective_ns_in_step_), std::memory_order_relaxed);
    }
    if (started != 0 && step_trained) {
      const int64_t longest = status.longest_progress_gap_ns.load(std::memory_order_relaxed);
      status.longest_progress_gap_ns.store(std::max(longest, longest_gap_in_step_ns_),
                                           std::memory_order_release);
    }
    longest_gap_in_step_ns_ = 0;
    collective_ns_in_step_ = 0;
    status.step.store(step, std::memory_order_release);
    touch();
  }
}

void RankStatusReporter::note_training_progress(int64_t now) {
  const bool working =
      collective_depth_ == 0 && phase_ != Phase::kStarting && phase_ != Phase::kFinishing;
  if (working && last_training_report_ns_ != 0) {
    longest_gap_in_step_ns_ = std::max(longest_gap_in_step_ns_, now - last_training_report_ns_);
  }
  last_training_report_ns_ = now;
}

void RankStatusReporter::on_phase(Phase phase) {
  if (map_) note_training_progress(steady_now_ns());
  phase_ = phase;
  if (map_) {
    (*map_)->phase.store(uint32_t(phase), std::memory_order_release);
    touch();
  }
  if (faults_ != nullptr) faults_->at(phase, step_.load(std::memory_order_relaxed));
}

void RankStatusReporter::on_progress() {
  if (!map_) return;
  const int64_t now = steady_now_ns();
  if (training_thread_.load(std::memory_order_relaxed) == std::this_thread::get_id()) {
    note_training_progress(now);
  }
  (*map_)->progress_ns.store(now, std::memory_order_release);
}

void RankStatusReporter::on_nested_phase(Phase phase) {
  if (faults_ != nullptr) faults_->at(phase, step_.load(std::memory_order_relaxed));
}

void RankStatusReporter::on_collective(std::string_view group, uint64_t seq) {
  const bool training =
      training_thread_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  // Nested (a collective inside the wait for the gradient reductions): the outer one counts.
  const bool outermost = training && collective_depth_ == 0;
  if (outermost) {
    phase_before_collective_ = phase_;
    collective_started_ns_ = steady_now_ns();
    // The work before the collective counts; the wait inside it does not.
    if (map_) note_training_progress(collective_started_ns_);
  }
  if (training) ++collective_depth_;
  if (map_) {
    (*map_)->collective_group.store(group);
    (*map_)->collective_seq.store(seq, std::memory_order_release);
    if (training) (*map_)->phase.store(uint32_t(Phase::kCollective), std::memory_order_release);
    touch();
  }
  if (faults_ != nullptr) faults_->at(Phase::kCollective, step_.load(std::memory_order_relaxed));
}

void RankStatusReporter::on_collective_end() {
  if (training_thread_.load(std::memory_order_relaxed) != std::this_thread::get_id() ||
      collective_depth_ == 0 || --collective_depth_ > 0 || !map_) {
    return;
  }
  const int64_t now = steady_now_ns();
  collective_ns_in_step_ += now - collective_started_ns_;
  last_training_report_ns_ = now;  // the wait was no work: the next gap starts here
  (*map_)->phase.store(uint32_t(phase_before_collective_), std::memory_order_release);
  touch();
}

void RankStatusReporter::begin_generation(int64_t generation, int rank) {
  if (faults_ != nullptr) faults_->set_rank(rank);
  if (!map_) return;
  RankStatus& status = **map_;
  status.generation.store(generation, std::memory_order_release);
  status.step_started_ns.store(0);
  status.last_step_ns.store(0);
  status.last_step_compute_ns.store(0);
  status.error.store("");
  collective_ns_in_step_ = 0;
  collective_depth_ = 0;
  last_training_report_ns_ = 0;
  longest_gap_in_step_ns_ = 0;
  status.phase.store(uint32_t(Phase::kStarting), std::memory_order_release);
  touch();
}

void RankStatusReporter::record_error(std::string_view message) {
  if (map_) (*map_)->error.store(message);
}

}  // namespace lattice
