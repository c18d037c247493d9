#include "ckpt/flat_range.h"

#include <algorithm>

#include "core/error.h"

namespace lattice {

namespace {

// Calls visit(spec, lo, hi) for each parameter overlapping [begin, end), with [lo, hi) the
// overlap in the parameter's local tensor's own element indices.
template <class Visit>
void for_each_overlap(const ParameterRegistry& registry, int64_t begin, int64_t end, Visit visit) {
  LATTICE_CHECK(begin >= 0 && begin <= end && end <= registry.total_elements(),
                "flat range [{}, {}) outside the store of {} elements", begin, end,
                registry.total_elements());
  for (const ParameterSpec& spec : registry.specs()) {
    const int64_t lo = std::max(begin, spec.offset);
    const int64_t hi = std::min(end, spec.offset + spec.local_shape.numel());
    if (lo < hi) visit(spec, lo - spec.offset, hi - spec.offset);
  }
}

Tensor flat_slice(const Tensor& t, int64_t begin, int64_t end) {
  return t.view(Shape{t.numel()}).slice_rows(begin, end);
}

void expect_range(const Tensor& t, int64_t n, std::string_view what) {
  expect_dtype(t, DType::kF32, "flat range", what);
  expect_shape(t, Shape{n}, "flat range", what);
}

}  // namespace

std::vector<OwnedShard> flat_range_shards(const ParameterRegistry& registry, const Tensor& master,
                                          const Tensor& m_range, const Tensor& v_range,
                                          int64_t begin, int64_t end, Arena* scratch,
                                          bool with_replicated,
                                          const std::function<bool(const ParameterSpec&)>& keep) {
  // The whole store's master weights, or (ZeRO-3) those of the range only.
  const bool whole_store = master.numel() == registry.total_elements();
  const int64_t master_first = whole_store ? 0 : begin;
  expect_range(master, whole_store ? registry.total_elements() : end - begin, "master");
  expect_range(m_range, end - begin, "m_range");
  expect_range(v_range, end - begin, "v_range");
  std::vector<OwnedShard> shards;
  for_each_overlap(registry, begin, end, [&](const ParameterSpec& spec, int64_t lo, int64_t hi) {
    if (spec.shard.replicated() && !with_replicated) return;
    if (keep && !keep(spec)) return;
    // The last pipeline stage's copy of the tied token table: the first stage writes the table
    // (the copies are equal, values and moments alike: they get the same summed gradient).
    if (spec.tied_copy) return;
    const int64_t local = spec.offset + lo - begin;  // position in the range tensors
    auto add = [&](const std::string& name, const Tensor& values) {
      for (const BoxPlacement& where : local_placements(spec.shape, spec.shard, values, lo, hi)) {
        shards.push_back(OwnedShard::from_local(name, spec.shape, where, scratch));
      }
    };
    add(spec.name,
        flat_slice(master, spec.offset + lo - master_first, spec.offset + hi - master_first));
    add(spec.name + ".exp_avg", flat_slice(m_range, local, local + hi - lo));
    add(spec.name + ".exp_avg_sq", flat_slice(v_range, local, local + hi - lo));
  });
  return shards;
}

void read_flat_range(const CheckpointReader& reader, const ParameterRegistry& registry,
                     int64_t begin, int64_t end, const Tensor& master_range, const Tensor& m_range,
                     const Tensor& v_range) {
  expect_range(master_range, end - begin, "master_range");
  expect_range(m_range, end - begin, "m_range");
  expect_range(v_range, end - begin, "v_range");
  for_each_overlap(registry, begin, end, [&](const ParameterSpec& spec, int64_t lo, int64_t hi) {
    const int64_t local = spec.offset + lo - begin;
    const int64_t n = hi - lo;
    reader.read_local_elements(spec.name, spec.shard, lo, hi,
                               flat_slice(master_range, local, local + n));
    reader.read_local_elements(spec.name + ".exp_avg", spec.shard, lo, hi,
                               flat_slice(m_range, local, local + n));
    reader.read_local_elements(spec.name + ".exp_avg_sq", spec.shard, lo, hi,
                               flat_slice(v_range, local, local + n));
  });
}

void expect_unsharded_model(const ParameterRegistry& registry, std::string_view what,
                            std::string_view hint) {
  const int tp = registry.tensor_parallel().size;
  if (tp > 1) {
    LATTICE_THROW(ConfigError,
                  "{} of a tensor-parallel model (--tp {}, this rank holds shard {}) needs whole "
                  "tensors in one process ---> HINT: {}",
                  what, tp, registry.tensor_parallel().rank, hint);
  }
}

}  // namespace lattice
