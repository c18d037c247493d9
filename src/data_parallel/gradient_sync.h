// The data-parallel seam: what a training step tells the synchroniser of its gradients over the
// dp group, whatever the ZeRO stage (Rajbhandari et al. 2020). One implementation per design:
//
//   no dp group (dp = 1)   LocalGradients: nothing to synchronise;
//   ZeRO-0 and 1           GradReducer (grad_reducer.h): the last micro-batch's backward
//                          all-reduces the whole gradient buffer in buckets; ZeRO-1's owners
//                          then update their shard and share it;
//   ZeRO-2 and 3           ShardedGradients (sharded_gradients.h): every backward reduces its
//                          lent bucket buffers into the owners' shards; ZeRO-3 also gathers each
//                          layer's parameters around its use (ParameterHooks).
//
// A step calls, in order: begin_step(); for each micro-batch begin_backward(last), the model's
// ready hook -> param_ready(index), end_backward(); then finish(); the gradient norm reads
// counted_range() and sum_counted(); after the optimizer's update after_update(). A pipeline
// stage's backwards run inside the schedule: it calls begin_step() and finish() only.
//
// A synchroniser borrows the model's ParameterStore and a dp group; make_gradient_sync builds
// one for a new group over the same store (an elastic generation that replaced a rank) without
// rebuilding the model.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/communicator.h"
#include "core/arena.h"
#include "model/parameter_hooks.h"
#include "model/parameters.h"
#include "parallel/comm_thread.h"
#include "parallel/grad_buckets.h"

namespace lattice {

// What the synchroniser measured: totals over the steps so far, and the last step's bucket
// launches.
struct GradientSyncStats {
  int zero = 0;  // ZeRO stage in effect (0 without a dp group)
  int buckets = 0;
  int64_t largest_bucket_elements = 0;
  // Buckets of the last step launched from backward's ready hook, before finish().
  int launched_during_backward = 0;
  // Seconds the reductions ran on the comm thread, and seconds the training thread waited for
  // them (the part not hidden behind backward): hidden fraction = 1 - exposed / communication.
  double communication_seconds = 0.0;
  double exposed_seconds = 0.0;
  // ZeRO-2/3: most bucket buffers lent at once, and the bound that can never be exceeded.
  int peak_lent = 0;
  int lent_bound = 0;
  // ZeRO-3: seconds the parameter gathers ran, most elements held gathered at once.
  double gather_seconds = 0.0;
  int64_t peak_gathered_elements = 0;
};

struct GradientSyncOptions {
  int64_t bucket_bytes = 1 << 20;  // of f32 gradients; <= 0: one bucket
  Algorithm algorithm = Algorithm::kAuto;
  // ZeRO-2/3: launched buckets still reducing before lending another waits for the oldest.
  int max_in_flight = 2;
  // Expert parallelism (ZeRO-0 and 1): the group the experts' gradients are summed over (the dp
  // ranks holding the same experts), and the group ZeRO-1 shards over (zero_sharding); nullptr:
  // dp. Their buckets hold expert parameters only.
  Communicator* expert_dp = nullptr;
};

class GradientSync {
 public:
  virtual ~GradientSync() = default;

  // Before the step's first backward.
  virtual void begin_step() = 0;
  // Before one micro-batch's backward; `last`: the step's last one.
  virtual void begin_backward(bool last) = 0;
  // The gradient of parameter `index` is final for the running backward (the model's hook).
  virtual void param_ready(int index) = 0;
  // After that backward.
  virtual void end_backward() = 0;
  // After the step's last backward: the store's gradients hold the sum over the dp group of
  // every element this rank counts (all of them, or its ZeRO-2/3 shard).
  virtual void finish() = 0;

  // The flat elements whose gradients this rank counts in the global norm (its owned shard
  // under ZeRO >= 1, each element on exactly one rank of the group; else all it holds), and the
  // sum of the ranks' partial sums over them (the identity when every rank counts everything).
  virtual FlatRange counted_range() const = 0;
  virtual double sum_counted(double local) = 0;

  // After the optimizer updated what this rank owns: every rank holds the values its next
  // forward reads (ZeRO-1/2: the owners' shards go to all; ZeRO-3: the next gather reads them).
  virtual void after_update() = 0;
  // After a forward-only pass (evaluation): frees what it left gathered.
  virtual void after_forward_only() = 0;
  // Hashes the replicas over the group and fails naming the first parameter that differs
  // (nothing to compare under ZeRO-3, where every element has one owner).
  virtual void check_replicas() = 0;

  // What the model calls around each layer (ZeRO-2/3), or nullptr.
  virtual ParameterHooks* parameter_hooks() = 0;
  virtual GradientSyncStats stats() const = 0;
};

// The synchroniser of `store`'s ZeRO stage over `dp` (nullptr or a group of one: LocalGradients).
std::unique_ptr<GradientSync> make_gradient_sync(Communicator* dp, ParameterStore& store,
                                                 Arena& arena, GradientSyncOptions options = {});

// ZeRO-1/2 after an update: the owners' updated shards of the master (and, under bf16 compute,
// of the compute copy and the f32 copies) go from the owners to every rank of `dp`.
void share_owned_updates(Communicator& dp, ParameterStore& store);

// The statistics every bucketed synchroniser reports.
GradientSyncStats bucket_stats(int zero, const std::vector<GradBucket>& buckets,
                               int launched_during_backward, double communication_seconds,
                               double exposed_seconds);

// Waits for the gradient reductions queued on `thread` and returns the seconds it waited: the
// training thread waiting on its peers' buckets, so reported as a collective
// (core/rank_progress.h: the agent tells a straggler by the time outside them) and traced idle.
double wait_for_buckets(CommThread& thread);

// Hashes the replicas of `store`'s values over `dp` (the master, or with the master sharded the
// compute copy and the f32 copies the same gather fills) and fails naming the first parameter
// that differs (parallel/replica_check.h).
// expert_dp: the expert parameters' replicas (expert parallelism), checked over it instead.
void check_store_replicas(Communicator& dp, ParameterStore& store,
                          Communicator* expert_dp = nullptr);

// Nothing to synchronise: one replica.
class LocalGradients final : public GradientSync {
 public:
  explicit LocalGradients(ParameterStore& store) : store_(store) {}
  void begin_step() override {}
  void begin_backward(bool) override {}
  void param_ready(int) override {}
  void end_backward() override {}
  void finish() override {}
  FlatRange counted_range() const override { return store_.grad_range(); }
  double sum_counted(double local) override { return local; }
  void after_update() override {}
  void after_forward_only() override {}
  void check_replicas() override {}
  ParameterHooks* parameter_hooks() override { return nullptr; }
  GradientSyncStats stats() const override { return {}; }

 private:
  ParameterStore& store_;
};

}  // namespace lattice
