#include "data_parallel/gradient_sync.h"

#include <algorithm>

#include "core/rank_progress.h"
#include "core/timer.h"

#include "data_parallel/grad_reducer.h"
#include "data_parallel/sharded_gradients.h"
#include "parallel/replica_check.h"
#include "parallel/zero_shards.h"
#include "trace/event_recorder.h"

namespace lattice {

std::unique_ptr<GradientSync> make_gradient_sync(Communicator* dp, ParameterStore& store,
                                                 Arena& arena, GradientSyncOptions options) {
  const ZeroSharding& zero = store.zero();
  if (dp == nullptr || dp->size() == 1) {
    LATTICE_CHECK(zero.ranks == 1, "a store sharded over {} ranks without a dp group", zero.ranks);
    return std::make_unique<LocalGradients>(store);
  }
  // ZeRO shards over the dp group, or under expert parallelism over the ranks holding the same
  // experts (zero_sharding).
  const Communicator& sharded_over = options.expert_dp != nullptr ? *options.expert_dp : *dp;
  LATTICE_CHECK(zero.ranks == sharded_over.size() && zero.rank == sharded_over.rank(),
                "the store is sharded as rank {} of {}, the group '{}' has this rank as {} of "
                "{}: a new group must keep every rank's place",
                zero.rank, zero.ranks, sharded_over.name(), sharded_over.rank(),
                sharded_over.size());
  LATTICE_CHECK(options.expert_dp == nullptr || zero.stage <= 1,
                "expert parallelism with ZeRO-{}: refused before (validate_moe_layout)",
                zero.stage);
  if (zero.shards_gradients())
    return std::make_unique<ShardedGradients>(*dp, store, arena, options);
  return std::make_unique<GradReducer>(*dp, store, options);
}

// Under bf16 compute (replicated_values) every owner updated the master and compute copy of its
// shard: the compute copy and the f32 copies of the parameters read in f32 go from the owners to
// all. Under f32 compute the compute copy is the master: its owned shards go to every replica.
void share_owned_updates(Communicator& dp, ParameterStore& store) {
  const ParameterRegistry& registry = store.registry();
  const int64_t P = registry.total_elements();
  if (!store.replicated_values()) {
    gather_shards(dp, store.master().data<float>(), store.master().numel());
    store.refresh_compute_copy();
    return;
  }
  Tensor& compute = store.compute();
  broadcast_from_owners(dp, compute.raw_data(), compute.dtype(), FlatRange{0, P}, P);
  const FlatRange owned = store.master_range();
  const float* master = store.master().data<float>();
  const auto& specs = registry.specs();
  for (int i = 0; i < int(specs.size()); ++i) {
    const ParameterSpec& spec = specs[size_t(i)];
    if (!spec.read_as_f32) continue;
    const FlatRange range{spec.offset, spec.offset + spec.local_shape.numel()};
    float* copy = store.f32_copy(i).data<float>();
    const int64_t begin = std::max(range.begin, owned.begin);
    const int64_t end = std::min(range.end, owned.end);
    if (begin < end) {
      std::copy(master + (begin - owned.begin), master + (end - owned.begin),
                copy + (begin - range.begin));
    }
    broadcast_from_owners(dp, copy, range, P);
  }
}

GradientSyncStats bucket_stats(int zero, const std::vector<GradBucket>& buckets,
                               int launched_during_backward, double communication_seconds,
                               double exposed_seconds) {
  GradientSyncStats s;
  s.zero = zero;
  s.buckets = int(buckets.size());
  for (const GradBucket& b : buckets) {
    s.largest_bucket_elements = std::max(s.largest_bucket_elements, b.size());
  }
  s.launched_during_backward = launched_during_backward;
  s.communication_seconds = communication_seconds;
  s.exposed_seconds = exposed_seconds;
  return s;
}

double wait_for_buckets(CommThread& thread) {
  Stopwatch watch;
  const CollectiveReport waiting("dp gradients", 0);
  TraceScope scope("wait for gradient buckets", TraceCategory::kIdle);
  thread.wait();
  return watch.seconds();
}

void check_store_replicas(Communicator& dp, ParameterStore& store, Communicator* expert_dp) {
  const Tensor& values = store.master_sharded() ? store.compute() : store.master();
  const std::vector<FlatRange> ranges = store.registry().padded_ranges();
  // Dense parameters over dp, expert ones over the ranks holding the same experts.
  for (const bool experts : {false, true}) {
    Communicator* group = experts ? expert_dp : &dp;
    if (experts && expert_dp == nullptr) break;
    std::vector<std::string> names;
    std::vector<FlatRange> kept;
    const auto& specs = store.registry().specs();
    for (size_t i = 0; i < specs.size(); ++i) {
      if (expert_dp != nullptr && specs[i].expert != experts) continue;
      names.push_back(specs[i].name);
      kept.push_back(ranges[i]);
    }
    if (!kept.empty() && group->size() > 1) check_replicas(*group, values, kept, names);
  }
}

}  // namespace lattice
