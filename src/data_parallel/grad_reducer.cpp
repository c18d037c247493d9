#include "data_parallel/grad_reducer.h"

#include <algorithm>

#include "core/timer.h"
#include "parallel/rank_sum.h"
#include "trace/event_recorder.h"

namespace lattice {

GradReducer::GradReducer(Communicator& dp, ParameterStore& store, GradientSyncOptions options)
    : dp_(dp), store_(store), grads_(store.grads()), options_(options) {
  LATTICE_CHECK(!store.gradients_lent(), "GradReducer: a ZeRO-{} store lends its gradients",
                store.zero().stage);
  expect_dtype(grads_, DType::kF32, "GradReducer", "gradients");
  const std::vector<FlatRange> params = store.registry().padded_ranges();
  const int64_t elements = options_.bucket_bytes / int64_t(sizeof(float));
  buckets_ =
      plan_grad_buckets(params, options_.bucket_bytes <= 0 ? 0 : std::max<int64_t>(1, elements));
  const int64_t covered = params.empty() ? 0 : params.back().end;
  LATTICE_CHECK(covered == grads_.numel(), "GradReducer: parameters cover {} of {} gradients",
                covered, grads_.numel());
  bucket_of_param_.resize(params.size());
  for (int b = 0; b < int(buckets_.size()); ++b) {
    for (int p = buckets_[size_t(b)].first_param; p < buckets_[size_t(b)].end_param; ++p) {
      bucket_of_param_[size_t(p)] = b;
    }
  }
  begin_step();
}

void GradReducer::begin_step() {
  thread_.wait();
  params_pending_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    params_pending_[b] = buckets_[b].end_param - buckets_[b].first_param;
  }
  launched_.assign(buckets_.size(), false);
  listening_ = false;
  launched_early_ = 0;
}

void GradReducer::param_ready(int index) {
  if (!listening_) return;  // an earlier micro-batch: its gradients still accumulate
  const int b = bucket_of_param_.at(size_t(index));
  LATTICE_CHECK(params_pending_[size_t(b)] > 0, "parameter {} reported ready twice", index);
  if (--params_pending_[size_t(b)] == 0) {
    launch(b);
    ++launched_early_;
  }
}

void GradReducer::finish() {
  for (int b = 0; b < int(buckets_.size()); ++b) {
    if (!launched_[size_t(b)]) launch(b);
  }
  listening_ = false;
  exposed_seconds_ += wait_for_buckets(thread_);
}

void GradReducer::launch(int bucket) {
  launched_[size_t(bucket)] = true;
  const GradBucket range = buckets_[size_t(bucket)];
  float* data = grads_.data<float>() + range.begin;
  CollectiveOptions options{.algorithm = options_.algorithm};
  EventRecorder* recorder = current_event_recorder();  // the rank's, recorded from the comm thread
  thread_.submit([this, data, range, options, recorder, bucket] {
    TraceScope scope(recorder, "dp all_reduce bucket", TraceCategory::kCollective,
                     {{"bucket", bucket}, {"bytes", range.size() * 4}, {"group", dp_.name()}});
    Stopwatch watch;
    dp_.all_reduce(data, range.size(), DType::kF32, ReduceOp::kSum, options);
    communication_seconds_ += watch.seconds();
  });
}

FlatRange GradReducer::counted_range() const {
  return store_.zero().owned(store_.registry().total_elements());
}

double GradReducer::sum_counted(double local) {
  return store_.zero().shards_optimizer() ? sum_over_ranks(dp_, {local})[0] : local;
}

void GradReducer::after_update() {
  if (store_.zero().shards_optimizer()) share_owned_updates(dp_, store_);
}

void GradReducer::check_replicas() {
  check_store_replicas(dp_, store_);
}

GradientSyncStats GradReducer::stats() const {
  return bucket_stats(store_.zero().stage, buckets_, launched_early_, communication_seconds_,
                      exposed_seconds_);
}

}  // namespace lattice
