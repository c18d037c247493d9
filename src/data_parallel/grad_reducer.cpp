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
  const int64_t bucket_elements = options_.bucket_bytes <= 0 ? 0 : std::max<int64_t>(1, elements);
  // Under expert parallelism a bucket holds dense or expert parameters, never both: they are
  // summed over different groups. The runs of each kind are planned apart, in flat order.
  const auto& specs = store.registry().specs();
  for (size_t first = 0; first < params.size();) {
    size_t end = first + 1;
    const bool expert = options_.expert_dp != nullptr && specs[first].expert;
    while (end < params.size() && (options_.expert_dp != nullptr && specs[end].expert) == expert) {
      ++end;
    }
    const std::vector<FlatRange> run(params.begin() + std::ptrdiff_t(first),
                                     params.begin() + std::ptrdiff_t(end));
    for (GradBucket b : plan_grad_buckets(run, bucket_elements)) {
      b.first_param += int(first);
      b.end_param += int(first);
      buckets_.push_back(b);
      bucket_group_.push_back(expert ? options_.expert_dp : &dp_);
    }
    first = end;
  }
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
  Communicator* group = bucket_group_[size_t(bucket)];
  thread_.submit([this, data, range, options, recorder, bucket, group] {
    TraceScope scope(recorder, "dp all_reduce bucket", TraceCategory::kCollective,
                     {{"bucket", bucket}, {"bytes", range.size() * 4}, {"group", group->name()}});
    Stopwatch watch;
    group->all_reduce(data, range.size(), DType::kF32, ReduceOp::kSum, options);
    communication_seconds_ += watch.seconds();
  });
}

FlatRange GradReducer::counted_range() const {
  return store_.zero().owned(store_.registry().total_elements());
}

double GradReducer::sum_counted(double local) {
  return store_.zero().shards_optimizer() ? sum_over_ranks(zero_group(), {local})[0] : local;
}

void GradReducer::after_update() {
  if (store_.zero().shards_optimizer()) share_owned_updates(zero_group(), store_);
}

void GradReducer::check_replicas() {
  check_store_replicas(dp_, store_, options_.expert_dp);
}

GradientSyncStats GradReducer::stats() const {
  return bucket_stats(store_.zero().stage, buckets_, launched_early_, communication_seconds_,
                      exposed_seconds_);
}

}  // namespace lattice
