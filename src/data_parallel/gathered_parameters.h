// ZeRO-3 parameters (Rajbhandari et al. 2020, §5.3): a rank keeps the f32 master weights of its
// shard only; the parameters of one unit (a transformer layer, or the embedding and head) are
// gathered from their owners into buffers lent just before the unit runs, and freed after.
//
// The gather of the next unit is started on the communication thread while the current one
// computes (prefetch), so at most three units are held at once: the ends (used at both ends of a
// step, ParameterHooks::kEnds), the running layer and the next. The f32 values are gathered and,
// under bf16 compute, rounded on arrival: the compute copy is bitwise the one ZeRO-0 would use.
#pragma once

#include <future>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "model/parameters.h"
#include "parallel/comm_thread.h"
#include "parallel/grad_buckets.h"

namespace lattice {

class GatheredParameters {
 public:
  // The store must shard its parameters (ZeroSharding stage 3).
  GatheredParameters(Communicator& dp, ParameterStore& store, CommThread& thread, Arena& arena);
  GatheredParameters(const GatheredParameters&) = delete;
  GatheredParameters& operator=(const GatheredParameters&) = delete;

  // Starts gathering `unit` on the comm thread unless it is held or on its way.
  void prefetch(int64_t unit);
  // On return the unit's parameters are bound in the store (waits for its prefetch, or gathers).
  void gather(int64_t unit);
  // Unbinds the unit's parameters and frees their buffers.
  void release(int64_t unit);
  // Releases every unit (after a step or a forward-only pass; the master shard is about to
  // change or the run is idle).
  void release_all();

  int64_t unit_count() const { return int64_t(units_.size()); }  // layers + 1 (the ends)
  // Most elements held gathered at once so far (their buffers are the documented transient bytes).
  int64_t peak_held_elements() const { return peak_held_; }
  double communication_seconds() const { return communication_seconds_; }

 private:
  struct Unit {
    std::vector<int> params;
    std::vector<FlatRange> ranges;  // merged flat ranges of its parameters (padding included)
    int64_t elements = 0;
  };
  struct Held {
    Tensor values;   // f32 (unit elements)
    Tensor compute;  // compute dtype (the same tensor under f32)
    std::shared_future<void> arrived;
    bool bound = false;
  };
  Unit& unit_of(int64_t unit);
  Held& held_of(int64_t unit) { return held_[size_t(unit + 1)]; }

  Communicator& dp_;
  ParameterStore& store_;
  CommThread& thread_;
  Arena& arena_;
  std::vector<Unit> units_;  // [unit + 1]
  std::vector<Held> held_;   // [unit + 1]: values.defined() while held or on its way
  int64_t held_elements_ = 0, peak_held_ = 0;
  double communication_seconds_ = 0.0;  // written by the comm thread
};

}  // namespace lattice
