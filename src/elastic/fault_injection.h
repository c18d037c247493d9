// Injected faults for tests and demos: LATTICE_FAULT=kind@phase:rank:step[:times][,...].
//
//   kill@backward:2:300     rank 2 SIGKILLs itself when it enters backward at step 300
//   stop@forward:1:5        rank 1 SIGSTOPs itself (a stopped process: no heartbeat)
//   hang@optimizer:0:7      rank 0 spins forever (heartbeat alive, progress frozen: livelock)
//   throw@collective:3:2    rank 3 throws FaultInjected in its first collective of step 2
//   slow@forward:1:0        rank 1 sleeps in every forward from step 0 on (a straggler)
//
// Steps are 0-based: the step about to train (the number of updates done before it); in the
// recovery phase the step of the snapshot being restored; `*` is any step. `times`
// (default 1) is how often the fault fires over the whole job: under `lattice launch` the
// firings are counted in the agent's job directory, so a restarted rank that reaches the same
// step does not fire a fault again unless `times` says so (`:3` makes a fault recur three
// times, the test of "the same fault at one step ends the run"). `slow` is not counted: from
// its step on, every entry into its phase sleeps LATTICE_FAULT_SLOW_MS (default 50 ms).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/rank_progress.h"

namespace lattice {

class FaultInjected : public Error {
  using Error::Error;
};

enum class FaultKind : uint8_t { kKill, kStop, kHang, kThrow, kSlow };
std::string_view fault_kind_name(FaultKind kind);

inline constexpr int64_t kAnyStep = -1;

struct FaultSpec {
  FaultKind kind = FaultKind::kKill;
  Phase phase = Phase::kForward;
  int rank = 0;
  int64_t step = 0;  // kAnyStep: the first time the phase is reached
  int times = 1;
  std::string to_string() const;  // the spec's own text, "kill@backward:2:300"
};

// ConfigError naming the malformed item and the grammar.
std::vector<FaultSpec> parse_fault_specs(std::string_view text);

class FaultInjector {
 public:
  // `count_dir`: where firings are counted across processes (the agent's job directory);
  // empty: counted in this process only.
  FaultInjector(std::vector<FaultSpec> faults, int rank, std::filesystem::path count_dir = {},
                int slow_ms = 50);
  // The faults of LATTICE_FAULT (nullopt when it is unset or empty) for `rank`.
  static std::optional<FaultInjector> from_environment(int rank,
                                                       std::filesystem::path count_dir = {});

  // Called at every phase entry (and every collective, as Phase::kCollective): fires the
  // faults due for this rank at (phase, step). A kill or stop never returns normally.
  void at(Phase phase, int64_t step);
  const std::vector<FaultSpec>& faults() const { return faults_; }
  // The rank this process is now (an elastic rank may join a later generation as another one).
  void set_rank(int rank) { rank_ = rank; }

 private:
  // Claims one firing of fault `index`; false when it has fired `times` already.
  bool claim(size_t index);
  void fire(const FaultSpec& fault, int64_t step);

  std::vector<FaultSpec> faults_;
  std::vector<int> fired_;  // in this process
  int rank_;
  std::filesystem::path count_dir_;
  int slow_ms_;
};

}  // namespace lattice
