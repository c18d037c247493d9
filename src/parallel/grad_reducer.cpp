#include "parallel/grad_reducer.h"

#include <algorithm>

#include "core/timer.h"
#include "trace/event_recorder.h"

namespace lattice {

GradReducer::GradReducer(Communicator& dp, Tensor grads, const std::vector<FlatRange>& params,
                         GradReducerOptions options)
    : dp_(dp), grads_(std::move(grads)), options_(options) {
  expect_dtype(grads_, DType::kF32, "GradReducer", "gradients");
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
  launched_early_ = 0;
}

void GradReducer::param_ready(int index) {
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
  Stopwatch watch;
  {
    TraceScope scope("wait for gradient buckets", TraceCategory::kIdle);
    thread_.wait();
  }
  exposed_seconds_ += watch.seconds();
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

}  // namespace lattice
