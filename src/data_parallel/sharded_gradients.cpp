#include "data_parallel/sharded_gradients.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/timer.h"
#include "parallel/rank_sum.h"
#include "parallel/zero_shards.h"
#include "trace/event_recorder.h"

namespace lattice {

ShardedGradients::ShardedGradients(Communicator& dp, ParameterStore& store, Arena& arena,
                                   GradientSyncOptions options)
    : dp_(dp), store_(store), arena_(arena), max_in_flight_(options.max_in_flight) {
  LATTICE_CHECK(max_in_flight_ >= 1, "ShardedGradients: max_in_flight {} < 1", max_in_flight_);
  LATTICE_CHECK(store.gradients_lent(), "ShardedGradients needs a store that lends gradients");
  const std::vector<FlatRange> params = store.registry().padded_ranges();
  const int64_t bucket_bytes = options.bucket_bytes;
  const int64_t elements = bucket_bytes / int64_t(sizeof(float));
  buckets_ = plan_grad_buckets(params, bucket_bytes <= 0 ? 0 : std::max<int64_t>(1, elements));
  const auto& specs = store.registry().specs();
  bucket_of_param_.resize(specs.size());
  int64_t max_layer = -1;
  for (const ParameterSpec& spec : specs) max_layer = std::max(max_layer, spec.layer);
  unit_buckets_.resize(size_t(max_layer + 2));
  for (int b = 0; b < int(buckets_.size()); ++b) {
    for (int p = buckets_[size_t(b)].first_param; p < buckets_[size_t(b)].end_param; ++p) {
      bucket_of_param_[size_t(p)] = b;
      std::vector<int>& of_unit = unit_buckets_[size_t(specs[size_t(p)].layer + 1)];
      if (of_unit.empty() || of_unit.back() != b) of_unit.push_back(b);
    }
  }
  lent_.resize(buckets_.size());
  pending_.assign(buckets_.size(), 0);
  launched_.assign(buckets_.size(), false);
  reduced_ = std::make_unique<std::atomic<bool>[]>(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) reduced_[b] = false;
  if (store.values_lent()) {
    gathered_ = std::make_unique<GatheredParameters>(dp, store, thread_, arena);
  }
  hooks_ = std::make_unique<ZeroHooks>(*this, gathered_.get(), int64_t(unit_buckets_.size()) - 1);
}

int ShardedGradients::lent_bound() const {
  size_t largest_unit = 0;
  for (size_t u = 1; u < unit_buckets_.size(); ++u) {
    largest_unit = std::max(largest_unit, unit_buckets_[u].size());
  }
  return int(unit_buckets_[0].size() + largest_unit) + max_in_flight_ + 1;
}

void ShardedGradients::lend(int64_t unit) {
  wait_for_in_flight();
  free_reduced();
  LATTICE_CHECK(unit + 1 >= 0 && size_t(unit + 1) < unit_buckets_.size(), "no parameter unit {}",
                unit);
  for (int b : unit_buckets_[size_t(unit + 1)]) {
    if (!lent_[size_t(b)].defined() && !launched_[size_t(b)]) lend_bucket(b);
  }
}

void ShardedGradients::lend_bucket(int bucket) {
  const GradBucket& range = buckets_[size_t(bucket)];
  Tensor buffer = Tensor::zeros(arena_, {range.size()}, DType::kF32, MemoryCategory::kGradients);
  const auto& specs = store_.registry().specs();
  for (int p = range.first_param; p < range.end_param; ++p) {
    const ParameterSpec& spec = specs[size_t(p)];
    const int64_t begin = spec.offset - range.begin;
    store_.bind_grad(
        p, buffer.slice_rows(begin, begin + spec.local_shape.numel()).view(spec.local_shape));
  }
  lent_[size_t(bucket)] = std::move(buffer);
  pending_[size_t(bucket)] = range.end_param - range.first_param;
  reduced_[size_t(bucket)] = false;
  peak_lent_ = std::max(peak_lent_, ++lent_count_);
}

void ShardedGradients::param_ready(int index) {
  const int b = bucket_of_param_.at(size_t(index));
  LATTICE_CHECK(lent_[size_t(b)].defined(),
                "gradient of parameter '{}' reported final, but its bucket was never lent (its "
                "unit's backward did not start)",
                store_.registry().at(index).name);
  LATTICE_CHECK(pending_[size_t(b)] > 0, "parameter {} reported ready twice", index);
  if (--pending_[size_t(b)] == 0) {
    launch(b);
    ++launched_early_;
    free_reduced();  // the buckets reduced meanwhile: keep few lent at once
  }
}

void ShardedGradients::launch(int bucket) {
  launched_[size_t(bucket)] = true;
  launch_order_.push_back(bucket);
  const FlatRange range{buckets_[size_t(bucket)].begin, buckets_[size_t(bucket)].end};
  float* data = lent_[size_t(bucket)].data<float>();
  EventRecorder* recorder = current_event_recorder();  // the rank's, recorded from the comm thread
  thread_.submit([this, bucket, range, data, recorder] {
    TraceScope scope(recorder, "dp reduce_to_owners bucket", TraceCategory::kCollective,
                     {{"bucket", bucket}, {"bytes", range.size() * 4}, {"group", dp_.name()}});
    Stopwatch watch;
    const FlatRange held = store_.grad_range();
    float* grads = store_.grads().data<float>();
    reduce_to_owners(dp_, data, range, store_.registry().total_elements(),
                     [&](FlatRange piece, const float* sums) {
                       float* into = grads + (piece.begin - held.begin);
                       for (int64_t i = 0; i < piece.size(); ++i) into[i] += sums[i];
                     });
    communication_seconds_ += watch.seconds();
    reduced_[size_t(bucket)] = true;
  });
}

void ShardedGradients::wait_for_in_flight() {
  // The oldest launched bucket first: the comm thread reduces them in launch order.
  while (true) {
    int in_flight = 0, oldest = -1;
    for (int b : launch_order_) {
      if (!lent_[size_t(b)].defined() || reduced_[size_t(b)]) continue;
      ++in_flight;
      if (oldest < 0) oldest = b;
    }
    if (in_flight < max_in_flight_) return;
    TraceScope scope("wait for gradient buckets in flight", TraceCategory::kIdle,
                     {{"bucket", oldest}});
    // Polled, not waited on: after a failed collective (a lost peer's timeout) the comm thread
    // drops the later tasks, and wait() then rethrows the failure here in bounded time.
    while (!reduced_[size_t(oldest)]) {
      if (thread_.failed()) thread_.wait();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    free_reduced();
  }
}

void ShardedGradients::free_reduced() {
  for (int b = 0; b < int(buckets_.size()); ++b) {
    if (lent_[size_t(b)].defined() && launched_[size_t(b)] && reduced_[size_t(b)]) free_bucket(b);
  }
}

void ShardedGradients::free_bucket(int bucket) {
  const GradBucket& range = buckets_[size_t(bucket)];
  for (int p = range.first_param; p < range.end_param; ++p) store_.unbind_grad(p);
  lent_[size_t(bucket)] = Tensor();
  --lent_count_;
}

void ShardedGradients::end_backward() {
  for (int b = 0; b < int(buckets_.size()); ++b) {
    // A bucket no backward lent (its parameters got no gradient) has nothing to reduce, but its
    // owners still expect the collective: lend it as zeros so every rank runs the same calls.
    if (!launched_[size_t(b)]) {
      if (!lent_[size_t(b)].defined()) lend_bucket(b);
      launch(b);
    }
  }
  exposed_seconds_ += wait_for_buckets(thread_);
  for (int b = 0; b < int(buckets_.size()); ++b) {
    if (lent_[size_t(b)].defined()) free_bucket(b);
    launched_[size_t(b)] = false;
  }
  launch_order_.clear();
}

void ShardedGradients::finish() {
  if (gathered_ != nullptr) gathered_->release_all();
}

double ShardedGradients::sum_counted(double local) {
  return sum_over_ranks(dp_, {local})[0];  // each element's gradient is on its owner only
}

void ShardedGradients::after_update() {
  if (gathered_ == nullptr) share_owned_updates(dp_, store_);
}

void ShardedGradients::after_forward_only() {
  if (gathered_ != nullptr) gathered_->release_all();
}

void ShardedGradients::check_replicas() {
  if (gathered_ == nullptr) check_store_replicas(dp_, store_);  // ZeRO-3: every element one owner
}

GradientSyncStats ShardedGradients::stats() const {
  GradientSyncStats s = bucket_stats(store_.zero().stage, buckets_, launched_early_,
                                     communication_seconds_, exposed_seconds_);
  s.peak_lent = peak_lent_;
  s.lent_bound = lent_bound();
  if (gathered_ != nullptr) {
    s.gather_seconds = gathered_->communication_seconds();
    s.peak_gathered_elements = gathered_->peak_held_elements();
  }
  return s;
}

}  // namespace lattice
