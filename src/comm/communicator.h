// Communicator: one rank's handle on a group of ranks, with the same interface on every
// transport (threads, mpi, gloo). Parallel layers get one per mesh group and pass it explicitly.
//
// Every call goes through validate_call() (call_spec.h), gets the group's next sequence number,
// a deadline (CollectiveOptions::timeout, else CommConfig::timeout) and an algorithm (forced by
// the options or chosen by the Tuner), and is recorded in stats(). Ranks of a group must make
// the same collective calls in the same order with the same counts, dtypes and options.
//
// Buffers: all_reduce and broadcast work in place; reduce_scatter takes n * c elements and
// leaves this rank's c; all_gather takes c and leaves n * c (the input may be the output's
// block `rank()`); reduce writes the result to `output` on the root only (every rank passes
// one). bf16 sums are
// accumulated in fp32 and rounded once at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/call_spec.h"
#include "comm/comm_stats.h"
#include "comm/transport.h"
#include "comm/tuner.h"
#include "core/tensor.h"

namespace lattice {

// How calls with CollectiveOptions::algorithm = kAuto pick their algorithm.
enum class AlgorithmChoice : uint8_t {
  // Ring for every collective (barriers: the binomial tree): the summation order, and so every
  // bit of a result, depends neither on timing nor on a profile (parallel.deterministic).
  kPinned,
  // The cheapest under the cost model at the call's size, fixed for the run: repeatable.
  kModel,
  // As kModel, re-measured and switched inside the call that closes a window of calls running
  // persistently slower than predicted (benchmarks and tests of the tuner).
  kRetunedAfterWindow,
  // As kModel; a size whose window ran slower than predicted is only marked, and re-measured
  // and switched in retune_at_step_boundary(), which every rank of the group calls at the same
  // point between steps (training): within a step each size keeps one algorithm.
  kRetunedAtStepBoundary,
};
std::string_view algorithm_choice_name(AlgorithmChoice choice);

struct CommConfig {
  // Default deadline of every blocking call (well under a minute: a lost peer must surface).
  std::chrono::milliseconds timeout{30000};
  // Measured alpha-beta models (`lattice bench comm --calibrate FILE`); empty: analytic default.
  CostProfile profile;
  AlgorithmChoice algorithms = AlgorithmChoice::kModel;
};

// One switch decision of the adaptive tuner, with the numbers behind it.
struct TuningEvent {
  Collective collective = Collective::kAllReduce;
  size_t bytes = 0;
  double slowdown = 0;  // mean measured / predicted time of the window, max over ranks
  Algorithm before = Algorithm::kAuto;
  Algorithm after = Algorithm::kAuto;
  std::vector<std::pair<Algorithm, double>> measured_seconds;  // max over ranks
  // The algorithm in use and the fastest, measured a second time when the first measurement
  // showed a gain (Tuner::confirmed_choice); empty otherwise.
  std::vector<std::pair<Algorithm, double>> confirmed_seconds;
  // The window's time with `before` over its re-measured time: every candidate's model is
  // scaled to its re-measure times this (the calls in use share the machine).
  double in_use_factor = 1.0;
};

class Communicator {
 public:
  // The world group of `transport`.
  explicit Communicator(std::shared_ptr<Transport> transport, CommConfig config = {});
  Communicator(Communicator&&) = default;
  Communicator& operator=(Communicator&&) = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return int(members_.size()); }
  const std::vector<int>& world_ranks() const { return members_; }  // group rank -> world rank
  const std::string& name() const { return name_; }
  // Renames the group for what it is (the device mesh names its groups "tp[pp0·dp1]", ...):
  // timeout and validation errors quote this name. Members should agree on it.
  void set_name(std::string name) { name_ = std::move(name); }
  TransportKind transport_kind() const { return transport_->kind(); }
  uint64_t sequence() const { return seq_; }  // collective calls made so far

  void all_reduce(Tensor& data, ReduceOp op, const CollectiveOptions& options = {});
  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op,
                  const CollectiveOptions& options = {});
  void reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op,
                      const CollectiveOptions& options = {});
  void reduce_scatter(const void* input, void* output, int64_t output_count, DType dtype,
                      ReduceOp op, const CollectiveOptions& options = {});
  void all_gather(const Tensor& input, Tensor& output, const CollectiveOptions& options = {});
  void all_gather(const void* input, void* output, int64_t input_count, DType dtype,
                  const CollectiveOptions& options = {});
  void broadcast(Tensor& data, int root, const CollectiveOptions& options = {});
  void broadcast(void* data, int64_t count, DType dtype, int root,
                 const CollectiveOptions& options = {});
  void reduce(const Tensor& input, Tensor& output, int root, ReduceOp op,
              const CollectiveOptions& options = {});
  void reduce(const void* input, void* output, int64_t count, DType dtype, int root, ReduceOp op,
              const CollectiveOptions& options = {});
  // Block j of `input` (send_counts[j] elements) goes to group rank j, block i of `output`
  // (recv_counts[i]) comes from rank i; blocks lie in rank order. One count per rank of the
  // group, matching the peers' (rank i's send_counts[j] is rank j's recv_counts[i]): a rank
  // that expects another length gets a CommError naming both. Pairwise exchange.
  void all_to_all(const void* input, const std::vector<int64_t>& send_counts, void* output,
                  const std::vector<int64_t>& recv_counts, DType dtype,
                  const CollectiveOptions& options = {});
  // Tagged point-to-point: a send matches the recv from this rank with the same tag, in order.
  void send(const Tensor& data, int peer, const CollectiveOptions& options = {});
  void send(const void* data, int64_t count, DType dtype, int peer,
            const CollectiveOptions& options = {});
  // Posts a send and returns at once (pipeline schedules, where neighbours send to each other
  // at the same time). `data` must stay unchanged until the returned handle's wait().
  class SendHandle {
   public:
    SendHandle() = default;
    // Blocks until the peer has the bytes; TimeoutError naming the group after the deadline.
    void wait();

   private:
    friend class Communicator;
    PendingSendPtr pending_;
    Deadline deadline_{};
    std::string what_;
  };
  SendHandle send_async(const Tensor& data, int peer, const CollectiveOptions& options = {});
  void recv(Tensor& data, int peer, const CollectiveOptions& options = {});
  void recv(void* data, int64_t count, DType dtype, int peer,
            const CollectiveOptions& options = {});
  void barrier(const CollectiveOptions& options = {});

  // Called by every rank of this group: ranks with the same color form a group, ordered by
  // (key, rank). Deterministic: the same calls give the same groups on every rank.
  Communicator split(int color, int key, const CollectiveOptions& options = {});
  // Called by every rank of this group with the same list of group ranks; members get the new
  // group (ranked in list order), the others nullopt.
  std::optional<Communicator> new_group(const std::vector<int>& ranks);

  const CommStats& stats() const { return stats_; }
  const Tuner& tuner() const { return tuner_; }
  const std::vector<TuningEvent>& tuning_events() const { return tuning_events_; }
  // Replaces the measured models kAuto calls are priced with (and drops runtime rescaling).
  // Every rank of the group must pass the same profile, or ranks would pick different algorithms.
  void set_profile(CostProfile profile) {
    tuner_ = Tuner(transport_->kind(), size(), std::move(profile));
  }
  // Algorithm a kAuto call of this collective and size would use now.
  Algorithm planned_algorithm(Collective collective, size_t bytes) const;
  // AlgorithmChoice::kRetunedAtStepBoundary: the sizes whose window ran slower than predicted
  // since the last call are judged on the slowdown agreed over the ranks (max), and the slow
  // ones re-measured and switched, logged with `when` ("after step 12"). Every rank of the group
  // calls it at the same point; it communicates only when a window closed, which happens at the
  // same call on every rank. Returns the number of sizes re-measured (0 in the other modes).
  int retune_at_step_boundary(std::string_view when);

 private:
  Communicator(std::shared_ptr<Transport> transport, std::vector<int> members, int rank,
               uint64_t context, std::string name, const CommConfig& config);

  void execute(const CallSpec& call);
  void run_algorithm(const CallSpec& call, Algorithm algorithm, uint64_t seq, Deadline deadline);
  void point_to_point(const CallSpec& call, Deadline deadline);
  [[noreturn]] void throw_timeout(const CallSpec& call, uint64_t seq, const PeerTimeout& e);
  // Adaptive tuning (communicator_tuning.cpp).
  void retune_if_slow(Collective collective, size_t bytes);
  void remeasure(Collective collective, size_t bytes, double slowdown, std::string_view when);
  void mark_window_closed(Collective collective, size_t bytes);
  std::vector<Tuner::WindowResult> agree_on_windows(
      const std::vector<std::pair<Collective, size_t>>& windows);
  double time_collective(Collective collective, Algorithm algorithm, size_t bytes);
  void* work_buffer(size_t bytes);

  std::shared_ptr<Transport> transport_;
  std::vector<int> members_;
  int rank_ = 0;
  uint64_t context_ = 0;
  std::string name_;
  CommConfig config_;
  uint64_t seq_ = 0;
  uint64_t groups_made_ = 0;
  CommStats stats_;
  Tuner tuner_;
  std::vector<TuningEvent> tuning_events_;
  // kRetunedAtStepBoundary: (collective, bytes) of each size bucket whose window closed since
  // the last boundary, in the order they closed (the same on every rank).
  std::vector<std::pair<Collective, size_t>> windows_closed_;
  std::vector<std::byte> work_;  // staging for reduce_scatter / reduce and fp32 bf16 sums
};

}  // namespace lattice
