#include "data_parallel/gathered_parameters.h"

#include <algorithm>
#include <cstring>

#include "core/timer.h"
#include "parallel/zero_shards.h"
#include "trace/event_recorder.h"

namespace lattice {

GatheredParameters::GatheredParameters(Communicator& dp, ParameterStore& store, CommThread& thread,
                                       Arena& arena)
    : dp_(dp), store_(store), thread_(thread), arena_(arena) {
  LATTICE_CHECK(store.values_lent(), "GatheredParameters needs a store that shards parameters");
  const ParameterRegistry& registry = store.registry();
  const auto& specs = registry.specs();
  int64_t max_layer = -1;
  for (const ParameterSpec& spec : specs) max_layer = std::max(max_layer, spec.layer);
  units_.resize(size_t(max_layer + 2));
  held_.resize(units_.size());
  for (int i = 0; i < int(specs.size()); ++i) {
    const ParameterSpec& spec = specs[size_t(i)];
    const int64_t end = registry.padded_range(i).end;
    Unit& unit = units_[size_t(spec.layer + 1)];
    unit.params.push_back(i);
    if (!unit.ranges.empty() && unit.ranges.back().end == spec.offset) {
      unit.ranges.back().end = end;
    } else {
      unit.ranges.push_back(FlatRange{spec.offset, end});
    }
    unit.elements += end - spec.offset;
  }
}

GatheredParameters::Unit& GatheredParameters::unit_of(int64_t unit) {
  LATTICE_CHECK(unit + 1 >= 0 && size_t(unit + 1) < units_.size(), "no parameter unit {}", unit);
  return units_[size_t(unit + 1)];
}

void GatheredParameters::prefetch(int64_t unit) {
  const Unit& u = unit_of(unit);
  Held& held = held_of(unit);
  if (held.values.defined()) return;
  // Allocated here, on the compute thread, so the arena sees the same order on every run.
  held.values = Tensor::empty(arena_, {u.elements}, DType::kF32, MemoryCategory::kParameters);
  held.compute = store_.compute_dtype() == DType::kF32
                     ? held.values
                     : Tensor::empty(arena_, {u.elements}, store_.compute_dtype(),
                                     MemoryCategory::kParameters);
  held_elements_ += u.elements;
  peak_held_ = std::max(peak_held_, held_elements_);
  auto arrived = std::make_shared<std::promise<void>>();
  held.arrived = arrived->get_future().share();
  // The task holds the buffers only while it runs: it drops them before saying they arrived, so
  // that a release right after frees them (the arena's peak is then the same on every run).
  EventRecorder* recorder = current_event_recorder();  // the rank's, recorded from the comm thread
  thread_.submit(
      [this, &u, unit, values = held.values, compute = held.compute, arrived, recorder]() mutable {
        try {
          TraceScope scope(recorder, "dp gather parameters", TraceCategory::kCollective,
                           {{"unit", unit}, {"bytes", u.elements * 4}, {"group", dp_.name()}});
          Stopwatch watch;
          const FlatRange mine = store_.master_range();
          const float* master = store_.master().data<float>();
          const int64_t total = store_.registry().total_elements();
          float* into = values.data<float>();
          int64_t at = 0;
          for (const FlatRange& range : u.ranges) {
            // This rank's piece comes from its master shard; the owners broadcast theirs.
            const int64_t begin = std::max(range.begin, mine.begin);
            const int64_t end = std::min(range.end, mine.end);
            if (begin < end) {
              std::memcpy(into + at + (begin - range.begin), master + (begin - mine.begin),
                          size_t(end - begin) * sizeof(float));
            }
            broadcast_from_owners(dp_, into + at, range, total);
            at += range.size();
          }
          if (compute.dtype() != DType::kF32) compute.copy_from(values);
          communication_seconds_ += watch.seconds();
        } catch (...) {
          values = Tensor();
          compute = Tensor();
          arrived->set_exception(std::current_exception());
          throw;
        }
        values = Tensor();
        compute = Tensor();
        arrived->set_value();
      });
}

void GatheredParameters::gather(int64_t unit) {
  prefetch(unit);
  Held& held = held_of(unit);
  if (held.arrived.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    TraceScope scope("wait for gathered parameters", TraceCategory::kIdle, {{"unit", unit}});
    held.arrived.wait();
  }
  try {
    held.arrived.get();  // rethrows the gather's failure
  } catch (const std::future_error&) {
    // Dropped unrun after an earlier task failed: that failure is the one to report.
    thread_.wait();
    throw;
  }
  if (held.bound) return;
  const Unit& u = unit_of(unit);
  const auto& specs = store_.registry().specs();
  // Each parameter's place in the unit's buffer: its offset within the merged ranges.
  int64_t at = 0;
  size_t range = 0;
  for (int p : u.params) {
    const ParameterSpec& spec = specs[size_t(p)];
    while (spec.offset >= u.ranges[range].end) at += u.ranges[range++].size();
    const int64_t begin = at + (spec.offset - u.ranges[range].begin);
    const int64_t end = begin + spec.local_shape.numel();
    store_.bind_values(p, held.values.slice_rows(begin, end).view(spec.local_shape),
                       held.compute.slice_rows(begin, end).view(spec.local_shape));
  }
  held.bound = true;
}

void GatheredParameters::release(int64_t unit) {
  Held& held = held_of(unit);
  if (!held.values.defined()) return;
  if (held.arrived.valid()) held.arrived.wait();  // the comm thread may still write into it
  for (int p : unit_of(unit).params) store_.unbind_values(p);
  held_elements_ -= unit_of(unit).elements;
  held = Held{};
}

void GatheredParameters::release_all() {
  for (int64_t unit = -1; unit + 1 < int64_t(units_.size()); ++unit) release(unit);
}

}  // namespace lattice
