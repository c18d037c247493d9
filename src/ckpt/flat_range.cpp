#include "ckpt/flat_range.h"

#include <algorithm>

#include "core/error.h"

namespace lattice {

namespace {

// Calls visit(spec, lo, hi) for each parameter overlapping [begin, end), with [lo, hi) the
// overlap in the parameter's own element indices.
template <class Visit>
void for_each_overlap(const ParameterRegistry& registry, int64_t begin, int64_t end, Visit visit) {
  expect_unsharded_model(registry, "a sharded checkpoint");
  LATTICE_CHECK(begin >= 0 && begin <= end && end <= registry.total_elements(),
                "flat range [{}, {}) outside the store of {} elements", begin, end,
                registry.total_elements());
  for (const ParameterSpec& spec : registry.specs()) {
    const int64_t lo = std::max(begin, spec.offset);
    const int64_t hi = std::min(end, spec.offset + spec.shape.numel());
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
                                          int64_t begin, int64_t end) {
  expect_range(master, registry.total_elements(), "master");
  expect_range(m_range, end - begin, "m_range");
  expect_range(v_range, end - begin, "v_range");
  std::vector<OwnedShard> shards;
  for_each_overlap(registry, begin, end, [&](const ParameterSpec& spec, int64_t lo, int64_t hi) {
    const int64_t local = spec.offset + lo - begin;  // position in the range tensors
    shards.push_back(
        {spec.name, spec.shape, lo, hi, flat_slice(master, spec.offset + lo, spec.offset + hi)});
    shards.push_back(
        {spec.name + ".exp_avg", spec.shape, lo, hi, flat_slice(m_range, local, local + hi - lo)});
    shards.push_back({spec.name + ".exp_avg_sq", spec.shape, lo, hi,
                      flat_slice(v_range, local, local + hi - lo)});
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
    reader.read_global_elements(spec.name, lo, hi, flat_slice(master_range, local, local + n));
    reader.read_global_elements(spec.name + ".exp_avg", lo, hi,
                                flat_slice(m_range, local, local + n));
    reader.read_global_elements(spec.name + ".exp_avg_sq", lo, hi,
                                flat_slice(v_range, local, local + n));
  });
}

void expect_unsharded_model(const ParameterRegistry& registry, std::string_view what) {
  const int tp = registry.tensor_parallel().size;
  if (tp > 1) {
    LATTICE_THROW(ConfigError,
                  "{} of a tensor-parallel model (--tp {}) is not supported yet: parameters are "
                  "tp shards ---> HINT: save, load or export from a --tp 1 run",
                  what, tp);
  }
}

}  // namespace lattice
