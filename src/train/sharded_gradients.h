// ZeRO-2/3 gradients (Rajbhandari et al. 2020, §5.2): a backward writes its parameters'
// gradients into bucket buffers lent for that backward only; as soon as a bucket's gradients are
// final, its elements are summed over the dp group into their owners (reduce_to_owners, on the
// communication thread) and added to the owner's shard of store.grads(); the bucket buffer is
// then freed. Between backwards only the owned shard (4Ψ/N bytes) stays.
//
// Every micro-batch's backward is reduced this way (the gradients of the next micro-batch need
// the buffers again), so gradient accumulation over m micro-batches costs m reductions, not one.
// The buckets are planned as in ZeRO-0 (parallel/grad_buckets.h) and launched in the order their
// parameters become final, the same on every rank; the reduction order is fixed (ring), so runs
// are bitwise repeatable.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "model/parameters.h"
#include "parallel/comm_thread.h"
#include "parallel/grad_buckets.h"

namespace lattice {

class ShardedGradients {
 public:
  // params: every parameter's flat range (padding included) tiling [0, P); bucket_bytes as in
  // GradReducerOptions. The store must lend gradients (ZeroSharding stage >= 2).
  // max_in_flight: launched buckets still reducing before lending another waits for the oldest.
  // It bounds the lent bytes whatever the comm thread's speed: the buckets of the ends and of
  // the running layer plus max_in_flight more.
  ShardedGradients(Communicator& dp, ParameterStore& store, const std::vector<FlatRange>& params,
                   int64_t bucket_bytes, CommThread& thread, Arena& arena, int max_in_flight = 2);
  ShardedGradients(const ShardedGradients&) = delete;
  ShardedGradients& operator=(const ShardedGradients&) = delete;

  // Before the backward of `unit` (a layer, or ParameterHooks::kEnds): lends zeroed buffers for
  // the buckets holding its parameters (those already lent in this backward stay as they are).
  void lend(int64_t unit);
  // Gradient of parameter `index` is final for this backward; launches its bucket when complete.
  void param_ready(int index);
  // After a backward: launches the buckets not yet launched, waits for all, frees the buffers.
  // store.grads() then holds this rank's shard of the sum over the group and the micro-batches.
  void finish_backward();

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // Most buckets lent at once so far (their buffers are the documented transient bytes), and the
  // bound it never exceeds: the ends' buckets, the buckets of the largest unit, the ones in
  // flight and the one being launched.
  int peak_lent() const { return peak_lent_; }
  int lent_bound() const;
  // As GradReducer: seconds the reductions ran on the comm thread, and seconds
  // finish_backward() waited for them.
  double communication_seconds() const { return communication_seconds_; }
  double exposed_seconds() const { return exposed_seconds_; }

 private:
  void lend_bucket(int bucket);
  void launch(int bucket);
  void wait_for_in_flight();
  void free_reduced();
  void free_bucket(int bucket);

  Communicator& dp_;
  ParameterStore& store_;
  CommThread& thread_;
  Arena& arena_;
  std::vector<GradBucket> buckets_;
  std::vector<int> bucket_of_param_;
  std::vector<std::vector<int>> unit_buckets_;  // [unit + 1]: the buckets a unit writes
  std::vector<Tensor> lent_;                    // per bucket: its buffer while lent
  std::vector<int> pending_;                    // per bucket: parameters not yet final
  std::vector<bool> launched_;
  std::vector<int> launch_order_;  // this backward's launches, oldest first
  int max_in_flight_ = 2;
  std::unique_ptr<std::atomic<bool>[]> reduced_;  // set by the comm thread
  int lent_count_ = 0, peak_lent_ = 0;
  double communication_seconds_ = 0.0;  // written by the comm thread, read after wait()
  double exposed_seconds_ = 0.0;
};

}  // namespace lattice
