// Data-parallel gradients under ZeRO-2 and 3 (Rajbhandari et al. 2020, §5.2; GradientSync,
// gradient_sync.h): a backward writes its parameters' gradients into bucket buffers lent for
// that backward only; as soon as a bucket's gradients are final, its elements are summed over
// the dp group into their owners (reduce_to_owners, on the communication thread) and added to
// the owner's shard of store.grads(); the bucket buffer is then freed. Between backwards only
// the owned shard (4Ψ/N bytes) stays. Under ZeRO-3 the parameters are sharded too: each layer's
// are gathered around its use (GatheredParameters, through the model's ParameterHooks).
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

#include "data_parallel/gathered_parameters.h"
#include "data_parallel/gradient_sync.h"
#include "data_parallel/zero_hooks.h"
#include "parallel/comm_thread.h"
#include "parallel/grad_buckets.h"

namespace lattice {

class ShardedGradients final : public GradientSync {
 public:
  // The store must lend gradients (ZeroSharding stage >= 2); its parameters' flat ranges are
  // bucketed by options.bucket_bytes as in ZeRO-0. options.max_in_flight: launched buckets
  // still reducing before lending another waits for the oldest. It bounds the lent bytes
  // whatever the comm thread's speed: the buckets of the ends and of the running layer plus
  // max_in_flight more.
  ShardedGradients(Communicator& dp, ParameterStore& store, Arena& arena,
                   GradientSyncOptions options = {});
  ShardedGradients(const ShardedGradients&) = delete;
  ShardedGradients& operator=(const ShardedGradients&) = delete;

  void begin_step() override {}
  void begin_backward(bool) override { launched_early_ = 0; }
  // Gradient of parameter `index` is final for this backward; launches its bucket when complete.
  void param_ready(int index) override;
  // After a backward: launches the buckets not yet launched, waits for all, frees the buffers.
  // store.grads() then holds this rank's shard of the sum over the group and the micro-batches.
  void end_backward() override;
  // ZeRO-3: releases the gathered parameters (the master shard is about to change).
  void finish() override;

  FlatRange counted_range() const override { return store_.grad_range(); }
  double sum_counted(double local) override;
  void after_update() override;
  void after_forward_only() override;
  void check_replicas() override;
  ParameterHooks* parameter_hooks() override { return hooks_.get(); }
  GradientSyncStats stats() const override;

  // Before the backward of `unit` (a layer, or ParameterHooks::kEnds): lends zeroed buffers for
  // the buckets holding its parameters (those already lent in this backward stay as they are).
  void lend(int64_t unit);

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // Most buckets lent at once so far (their buffers are the documented transient bytes), and the
  // bound it never exceeds: the ends' buckets, the buckets of the largest unit, the ones in
  // flight and the one being launched.
  int peak_lent() const { return peak_lent_; }
  int lent_bound() const;

 private:
  void lend_bucket(int bucket);
  void launch(int bucket);
  void wait_for_in_flight();
  void free_reduced();
  void free_bucket(int bucket);

  Communicator& dp_;
  ParameterStore& store_;
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
  int launched_early_ = 0;              // by param_ready in the running backward
  double communication_seconds_ = 0.0;  // written by the comm thread, read after wait()
  double exposed_seconds_ = 0.0;
  std::unique_ptr<GatheredParameters> gathered_;  // ZeRO-3
  std::unique_ptr<ZeroHooks> hooks_;
  // Runs the reductions and gathers; last, so that it is joined before its tasks' members go.
  CommThread thread_;
};

}  // namespace lattice
