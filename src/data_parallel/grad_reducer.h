// Data-parallel gradients under ZeRO-0 and 1: the flat gradient buffer is summed over the dp
// group, bucket by bucket, on the rank's communication thread (GradientSync, gradient_sync.h).
//
// Gradients accumulate over the step's micro-batches in the buffer; during the backward of the
// last one the model reports each parameter whose gradient is final (param_ready), and a bucket
// is launched as soon as all its parameters are, so its all-reduce runs while backward computes
// the earlier layers. finish() launches whatever is left (in bucket order) and waits for all.
// Every rank sees the parameters become ready in the same order (the same backward), so the
// collectives match. The algorithm is the dp group's choice per bucket size
// (CommConfig::algorithms: the tuner's, or ring under parallel.deterministic); a forced one can
// be given. Under ZeRO-1 each rank then updates its owned shard and after_update() shares it.
#pragma once

#include <cstdint>
#include <vector>

#include "data_parallel/gradient_sync.h"
#include "parallel/comm_thread.h"
#include "parallel/grad_buckets.h"

namespace lattice {

class GradReducer final : public GradientSync {
 public:
  // store: its gradients (all P elements: stage 0 or 1) are reduced over `dp`.
  GradReducer(Communicator& dp, ParameterStore& store, GradientSyncOptions options = {});

  // Marks every bucket pending; nothing is launched before the last micro-batch's backward.
  void begin_step() override;
  void begin_backward(bool last) override { listening_ = last; }
  void param_ready(int index) override;
  void end_backward() override {}
  // Launches the buckets not yet launched, waits for all; the buffer then holds the sum.
  void finish() override;

  FlatRange counted_range() const override;
  double sum_counted(double local) override;
  void after_update() override;
  void after_forward_only() override {}
  void check_replicas() override;
  ParameterHooks* parameter_hooks() override { return nullptr; }
  GradientSyncStats stats() const override;

  const std::vector<GradBucket>& buckets() const { return buckets_; }

 private:
  void launch(int bucket);
  // What ZeRO-1 shards over: dp, or under expert parallelism the experts' replicas.
  Communicator& zero_group() { return options_.expert_dp != nullptr ? *options_.expert_dp : dp_; }

  Communicator& dp_;
  ParameterStore& store_;
  Tensor grads_;
  GradientSyncOptions options_;
  std::vector<GradBucket> buckets_;
  std::vector<Communicator*> bucket_group_;  // per bucket: dp, or the experts' replicas
  std::vector<int> bucket_of_param_;
  std::vector<int> params_pending_;  // per bucket
  std::vector<bool> launched_;
  bool listening_ = false;  // the running backward is the step's last
  int launched_early_ = 0;
  double communication_seconds_ = 0.0;  // written by the comm thread, read after wait()
  double exposed_seconds_ = 0.0;
  CommThread thread_;  // last: joins before the members its tasks use are destroyed
};

}  // namespace lattice
