// Where a rank is in its training, told to whoever watches it (DESIGN.md, elastic/).
//
// The training step reports its phase and step (train/), the communicator each collective it
// enters (comm/). A rank started by `lattice launch` installs a ProgressSink that writes these
// into shared memory its agent reads (elastic/rank_status.h) and fires the injected faults of
// LATTICE_FAULT (elastic/fault_injection.h); otherwise nothing is installed and a report costs
// one relaxed load. One sink per process: an elastic rank is a process.
#pragma once

#include <cstdint>
#include <string_view>

namespace lattice {

// kStarting and kFinishing are phases no progress timeout applies to (model build, data
// loading, the final checkpoint and sampling); the heartbeat still does.
enum class Phase : uint8_t {
  kStarting,
  kForward,
  kBackward,
  kCollective,
  kOptimizer,
  kSnapshot,
  kCheckpoint,
  kRecovery,
  kEvaluate,
  kFinishing,
};
inline constexpr int kPhaseCount = 10;

std::string_view phase_name(Phase phase);  // "forward", ...
// The phase of a name, or nullopt-like false: returns false for an unknown name.
bool parse_phase(std::string_view name, Phase& phase);

class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  virtual void on_step(int64_t step) = 0;  // the step about to train (0-based: updates done)
  virtual void on_phase(Phase phase) = 0;
  // Work done inside the current phase (a layer, the head's GEMM, a micro-batch): the phase
  // goes on, and the rank is not stuck.
  virtual void on_progress() = 0;
  // Work of `phase` beside the phase the rank reports (report_nested_phase).
  virtual void on_nested_phase(Phase phase) = 0;
  // Entered collective call `seq` of group `group` (the communicator's name), and left it.
  // Called from whichever thread runs the collective (the training or the gradient comm thread).
  virtual void on_collective(std::string_view group, uint64_t seq) = 0;
  virtual void on_collective_end() = 0;
};

// Installs (or with nullptr removes) the process's sink. Not thread-safe against reports in
// flight: install before training starts and remove after it ends.
void set_progress_sink(ProgressSink* sink);

void report_step(int64_t step);
void report_phase(Phase phase);
// A step forward inside a long phase (ProgressSink::on_progress): model layers and
// micro-batches report one each, so that the agent's stuck verdict does not grow with the model.
void report_progress();
// Work of `phase` that leaves the reported phase as it is: on a thread beside the training
// thread (an asynchronous checkpoint's writer), or inside a phase the agent must keep seeing
// (the final checkpoint inside kFinishing, which no progress timeout applies to). Only the
// faults injected at `phase` fire; the phase and progress the agent judges do not change.
void report_nested_phase(Phase phase);
// A collective from entry to exit (Communicator::execute).
class CollectiveReport {
 public:
  CollectiveReport(std::string_view group, uint64_t seq);
  ~CollectiveReport();
  CollectiveReport(const CollectiveReport&) = delete;
  CollectiveReport& operator=(const CollectiveReport&) = delete;

 private:
  ProgressSink* sink_;
};

// Reports `phase` now and the previous phase again when the scope ends.
class PhaseScope {
 public:
  explicit PhaseScope(Phase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase previous_;
};

}  // namespace lattice
