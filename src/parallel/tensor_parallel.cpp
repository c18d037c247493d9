#include "parallel/tensor_parallel.h"

#include "comm/comm_stats.h"
#include "core/error.h"
#include "core/timer.h"

namespace lattice {

TensorParallel::TensorParallel(Communicator* group, bool sequence_parallel)
    : group_(group != nullptr && group->size() > 1 ? group : nullptr),
      sequence_parallel_(sequence_parallel) {}

void TensorParallel::record(std::string_view op, std::string_view what, int64_t elements,
                            DType dtype) {
  if (logging_) log_.push_back({std::string(op), std::string(what), elements, dtype});
}

void TensorParallel::count(Collective collective, int64_t bytes, double seconds) {
  ++stats_.calls;
  stats_.bytes += bytes;
  stats_.bus_bytes += double(bytes) * bus_bandwidth_factor(collective, size());
  stats_.seconds += seconds;
}

void TensorParallel::all_reduce(Tensor& partial, std::string_view what) {
  record("all_reduce", what, partial.numel(), partial.dtype());
  if (group_ == nullptr) return;
  const Stopwatch watch;
  group_->all_reduce(partial, ReduceOp::kSum);
  count(Collective::kAllReduce, int64_t(partial.nbytes()), watch.seconds());
}

void TensorParallel::all_reduce_max(Tensor& data, std::string_view what) {
  record("all_reduce_max", what, data.numel(), data.dtype());
  if (group_ == nullptr) return;
  const Stopwatch watch;
  group_->all_reduce(data, ReduceOp::kMax);
  count(Collective::kAllReduce, int64_t(data.nbytes()), watch.seconds());
}

void TensorParallel::all_gather_rows(Tensor& full, const Tensor& shard, std::string_view what) {
  LATTICE_CHECK(full.numel() == shard.numel() * size() && full.dtype() == shard.dtype(),
                "all_gather_rows({}): full {} {} is not {} × shard {} {}", what,
                full.shape().to_string(), dtype_name(full.dtype()), size(),
                shard.shape().to_string(), dtype_name(shard.dtype()));
  record("all_gather", what, full.numel(), full.dtype());
  if (group_ == nullptr) {
    if (full.raw_data() != shard.raw_data()) full.copy_from(shard.view(full.shape()));
    return;
  }
  const Stopwatch watch;
  group_->all_gather(shard, full);
  count(Collective::kAllGather, int64_t(full.nbytes()), watch.seconds());
}

void TensorParallel::reduce_scatter_rows(Tensor& shard, const Tensor& full, std::string_view what) {
  LATTICE_CHECK(full.numel() == shard.numel() * size() && full.dtype() == shard.dtype(),
                "reduce_scatter_rows({}): full {} {} is not {} × shard {} {}", what,
                full.shape().to_string(), dtype_name(full.dtype()), size(),
                shard.shape().to_string(), dtype_name(shard.dtype()));
  record("reduce_scatter", what, full.numel(), full.dtype());
  if (group_ == nullptr) {
    if (full.raw_data() != shard.raw_data()) shard.copy_from(full.view(shard.shape()));
    return;
  }
  const Stopwatch watch;
  group_->reduce_scatter(full, shard, ReduceOp::kSum);
  count(Collective::kReduceScatter, int64_t(full.nbytes()), watch.seconds());
}

}  // namespace lattice
