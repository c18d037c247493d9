// Data-parallel gradient reduction (ZeRO-0): sums the flat gradient buffer over the dp group,
// bucket by bucket, on the rank's communication thread.
//
// During the backward of the last micro-batch the model reports each parameter whose gradient is
// final (param_ready); a bucket is launched as soon as all its parameters are, so its all-reduce
// runs while backward computes the earlier layers. finish() launches whatever is left (in bucket
// order) and waits for all. Every rank sees the parameters become ready in the same order (the
// same backward), so the collectives match. The algorithm is the dp group's choice per bucket
// size (CommConfig::algorithms: the tuner's, or ring under parallel.deterministic); a forced
// one can be given.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "parallel/comm_thread.h"
#include "parallel/grad_buckets.h"

namespace lattice {

struct GradReducerOptions {
  int64_t bucket_bytes = 1 << 20;  // of f32 gradients; <= 0: one bucket
  Algorithm algorithm = Algorithm::kAuto;
};

class GradReducer {
 public:
  // grads: f32 (P), borrowed; params: the parameters' flat ranges covering [0, P) in order.
  GradReducer(Communicator& dp, Tensor grads, const std::vector<FlatRange>& params,
              GradReducerOptions options = {});

  // Marks every bucket pending; call before the backward whose gradients will be reduced.
  void begin_step();
  // Gradient of parameter `index` is final for this step.
  void param_ready(int index);
  // Launches the buckets not yet launched, waits for all; the buffer then holds the sum.
  void finish();

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // Buckets launched by param_ready (i.e. during backward) in the last step.
  int launched_during_backward() const { return launched_early_; }
  // Totals over all steps so far: seconds the collectives ran on the comm thread, and seconds
  // finish() blocked on them (the part not hidden behind backward). Hidden fraction =
  // 1 - exposed / communication.
  double communication_seconds() const { return communication_seconds_; }
  double exposed_seconds() const { return exposed_seconds_; }

 private:
  void launch(int bucket);

  Communicator& dp_;
  Tensor grads_;
  GradReducerOptions options_;
  std::vector<GradBucket> buckets_;
  std::vector<int> bucket_of_param_;
  std::vector<int> params_pending_;  // per bucket
  std::vector<bool> launched_;
  int launched_early_ = 0;
  double communication_seconds_ = 0.0;  // written by the comm thread, read after wait()
  double exposed_seconds_ = 0.0;
  CommThread thread_;  // last: joins before the members its tasks use are destroyed
};

}  // namespace lattice
