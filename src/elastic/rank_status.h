// A rank's status in shared memory: the record its agent reads to tell a live rank from a
// dead, stopped or stuck one (docs/elastic.md, "Liveness").
//
// The agent creates one file per rank in its job directory (tmpfs: /dev/shm), the rank maps it
// and writes; both map it MAP_SHARED, so the agent sees every store at once and the record
// outlives the rank. The heartbeat is written by a thread of its own (a stopped process stops
// beating; a livelocked one beats but makes no progress); everything else by the sink that
// the training thread reports to (core/rank_progress.h). Times are steady-clock nanoseconds,
// which on Linux is CLOCK_MONOTONIC: one clock for every process of the node.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "core/rank_progress.h"

namespace lattice {

// Up to 8·Words - 1 characters in relaxed atomic words.
template <size_t Words>
struct AtomicText {
  std::atomic<uint64_t> words[Words] = {};
  void store(std::string_view text);
  std::string load() const;
};

// Lock-free atomics are address-free, so they work across processes in a shared mapping.
struct RankStatus {
  static constexpr uint64_t kMagic = 0x4c41545354415433ull;  // "LATSTAT3"
  uint64_t magic = kMagic;
  std::atomic<int64_t> pid{0};
  std::atomic<int64_t> generation{0};
  std::atomic<int64_t> heartbeat_ns{0};  // 0: not started
  std::atomic<int64_t> progress_ns{0};   // when step, phase or collective last changed
  std::atomic<int64_t> step{0};
  std::atomic<uint32_t> phase{uint32_t(Phase::kStarting)};
  std::atomic<uint64_t> collective_seq{0};
  std::atomic<int64_t> step_started_ns{0};
  std::atomic<int64_t> last_step_ns{0};  // duration of the last finished step
  // Of it, the time the training thread was not waiting in a collective (a straggler's is long).
  std::atomic<int64_t> last_step_compute_ns{0};
  // The longest the training thread went without reporting progress while it worked (waits in
  // a collective excluded) over the steps this process finished; 0 before its first. The
  // agent's stuck verdict scales with it (docs/elastic.md, "Liveness").
  std::atomic<int64_t> longest_progress_gap_ns{0};
  // The agent's assignment, written by the agent and read by the rank: the generation to join,
  // this process's rank and world size in it, and whether the layout is to be refit to a world
  // smaller than the command's. The generation is stored last (release), so a rank that sees a
  // new one sees the rest; -1: none yet (a spare).
  std::atomic<int32_t> assigned_rank{-1};
  std::atomic<int32_t> assigned_world{0};
  std::atomic<uint32_t> assigned_refit{0};
  std::atomic<int64_t> assigned_generation{-1};
  // Text fields, packed 8 characters a word so that the compute and comm threads may both
  // write them (a read between two writers' words shows a mixed name, never a torn word).
  AtomicText<8> collective_group;
  AtomicText<56> error;
};
static_assert(std::atomic<int64_t>::is_always_lock_free);

int64_t steady_now_ns();

// A read-write shared mapping of one RankStatus file.
class RankStatusMap {
 public:
  // create: makes (or truncates) the file, mode 0600, and initialises the record.
  static RankStatusMap create(const std::filesystem::path& path);
  // Maps an existing record. IoError naming the file when it is missing or not a record.
  static RankStatusMap open(const std::filesystem::path& path);
  ~RankStatusMap();
  RankStatusMap(RankStatusMap&& other) noexcept;
  RankStatusMap& operator=(RankStatusMap&& other) noexcept;
  RankStatusMap(const RankStatusMap&) = delete;
  RankStatusMap& operator=(const RankStatusMap&) = delete;

  RankStatus& operator*() const { return *status_; }
  RankStatus* operator->() const { return status_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  RankStatusMap(std::filesystem::path path, RankStatus* status)
      : path_(std::move(path)), status_(status) {}
  std::filesystem::path path_;
  RankStatus* status_ = nullptr;
};

// The sink of a rank process: progress into the status record and a heartbeat from its own
// thread when an agent watches it (`map`), and the injected faults (fault_injection.h) fired at
// the phases they name.
class FaultInjector;
class RankStatusReporter : public ProgressSink {
 public:
  RankStatusReporter(std::optional<RankStatusMap> map, int64_t generation, FaultInjector* faults,
                     std::chrono::milliseconds heartbeat_interval);
  ~RankStatusReporter() override;  // stops the heartbeat

  void on_step(int64_t step) override;
  void on_phase(Phase phase) override;
  void on_progress() override;
  void on_nested_phase(Phase phase) override;  // fires the faults only
  // On the training thread (the one that reports steps) the phase is kCollective until the
  // collective ends: the agent tells a rank that waits for a peer from the peer it waits for.
  void on_collective(std::string_view group, uint64_t seq) override;
  void on_collective_end() override;
  // Leaves `message` for the agent (the error that ends the rank).
  void record_error(std::string_view message);
  // Enters a generation: the record says it, and the injected faults fire for `rank`.
  void begin_generation(int64_t generation, int rank);

 private:
  void touch() {
    if (map_) (*map_)->progress_ns.store(steady_now_ns(), std::memory_order_release);
  }
  // Progress of the training thread at `now`: the time since its last report counts towards
  // the step's longest gap when the thread was working (not waiting in a collective, nor
  // starting or finishing, which no progress limit applies to).
  void note_training_progress(int64_t now);

  std::optional<RankStatusMap> map_;
  std::atomic<int64_t> step_{0};
  std::atomic<std::thread::id> training_thread_{};
  Phase phase_before_collective_ = Phase::kStarting;  // training thread only
  Phase phase_ = Phase::kStarting;                    // training thread only
  int64_t collective_started_ns_ = 0;                 // training thread only
  int64_t collective_ns_in_step_ = 0;                 // training thread only
  int collective_depth_ = 0;                          // training thread only
  int64_t last_training_report_ns_ = 0;               // training thread only
  int64_t longest_gap_in_step_ns_ = 0;                // training thread only
  FaultInjector* faults_;
  std::chrono::milliseconds heartbeat_interval_;
  std::atomic<bool> stopping_{false};
  std::thread heartbeat_;
};

}  // namespace lattice
