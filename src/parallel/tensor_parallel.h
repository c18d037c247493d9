// One rank's tensor-parallel group and the collectives of the Megatron-LM design.
//
// Column-parallel layers need their input whole on every rank of the group and produce a
// slice of the output features; row-parallel layers take that slice and produce partial sums
// of the whole output. Between them:
//   - without sequence parallelism the residual stream is whole on every rank: the partial sums
//     are all-reduced (forward after row-parallel; backward after column-parallel);
//   - with sequence parallelism (Korthikanti et al. 2022) the residual stream, the norms and the
//     dropout are split by token rows: all-gather before column-parallel, reduce-scatter after
//     row-parallel (and the conjugate pair in backward), the same bytes as one all-reduce.
// Every call is forced to the ring algorithm so that the same layout twice is bitwise
// identical (the tuner may switch algorithms on timing), and is recorded in log() for
// `lattice explain` and for tests that check the recorded list against the predicted one.
// Every call that communicates is also counted in stats() (calls, bytes, wall time), always on:
// `lattice bench tp` reads from it the fraction of a step spent in tensor-parallel collectives.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace lattice {

// What the model needs to know to build its shards: no communicator, so that a model can be
// described (lattice explain) without running anything.
struct TensorParallelLayout {
  int size = 1;
  int rank = 0;
  bool sequence_parallel = false;
};

struct CollectiveRecord {
  std::string op;        // "all_reduce", "all_gather", "reduce_scatter"
  std::string what;      // which activation or gradient, e.g. "layer 0 attn out (fwd)"
  int64_t elements = 0;  // of the full (unsplit) buffer
  DType dtype = DType::kF32;
};

// What this rank's collectives cost since the last reset_stats(). Only calls that go to a group
// of two or more ranks count (a group of one communicates nothing).
struct TensorParallelStats {
  int64_t calls = 0;
  int64_t bytes = 0;     // the full (unsplit) buffer of each call, as nccl-tests counts it
  double bus_bytes = 0;  // bytes × the nccl-tests bus factor (all-reduce 2(n-1)/n, all-gather
                         // and reduce-scatter (n-1)/n): what each rank sends on a ring, so an
                         // all-gather + reduce-scatter pair equals one all-reduce of that buffer
  double seconds = 0.0;  // steady-clock wall time inside the calls, waiting for peers included
};

class TensorParallel {
 public:
  TensorParallel() = default;  // a group of one: every collective is a no-op
  TensorParallel(Communicator* group, bool sequence_parallel);

  int size() const { return group_ == nullptr ? 1 : group_->size(); }
  int rank() const { return group_ == nullptr ? 0 : group_->rank(); }
  bool sequence_parallel() const { return sequence_parallel_; }
  TensorParallelLayout layout() const { return {size(), rank(), sequence_parallel_}; }
  Communicator* group() const { return group_; }

  // Sums partial results in place over the group.
  void all_reduce(Tensor& partial, std::string_view what);
  // Element-wise maximum in place over the group (f32).
  void all_reduce_max(Tensor& data, std::string_view what);
  // full (R·size, X...) = the shards (R, X...) of every rank, in rank order.
  void all_gather_rows(Tensor& full, const Tensor& shard, std::string_view what);
  // shard (R, X...) = rows [rank·R, (rank+1)·R) of Σ over the group of full (R·size, X...).
  void reduce_scatter_rows(Tensor& shard, const Tensor& full, std::string_view what);

  void set_logging(bool on) { logging_ = on; }
  const std::vector<CollectiveRecord>& log() const { return log_; }
  void clear_log() { log_.clear(); }

  const TensorParallelStats& stats() const { return stats_; }
  double comm_seconds() const { return stats_.seconds; }
  void reset_stats() { stats_ = {}; }

 private:
  void record(std::string_view op, std::string_view what, int64_t elements, DType dtype);
  void count(Collective collective, int64_t bytes, double seconds);

  Communicator* group_ = nullptr;
  bool sequence_parallel_ = false;
  bool logging_ = false;
  std::vector<CollectiveRecord> log_;
  TensorParallelStats stats_;
};

}  // namespace lattice
