#include "parallel/replica_check.h"

#include <cstring>

#include "core/error.h"

namespace lattice {

// Offset basis and prime from the reference parameters.
uint64_t hash_bytes(const unsigned char* bytes, int64_t count) {
  uint64_t hash = 14695981039346656037ull;
  for (int64_t i = 0; i < count; ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

uint64_t hash_floats(const float* data, int64_t count) {
  return hash_bytes(reinterpret_cast<const unsigned char*>(data), count * int64_t(sizeof(float)));
}

int check_replicas(Communicator& dp, const Tensor& master, const std::vector<FlatRange>& params,
                   const std::vector<std::string>& names) {
  LATTICE_CHECK(params.size() == names.size(), "check_replicas: {} ranges but {} names",
                params.size(), names.size());
  const auto* base = static_cast<const unsigned char*>(master.raw_data());
  const int64_t element = int64_t(dtype_size(master.dtype()));
  const int n = dp.size();
  const int64_t count = int64_t(params.size());
  // Each 64-bit hash travels as two i32 words: (n, P, 2) after the all-gather.
  std::vector<uint64_t> local(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const FlatRange& p = params[size_t(i)];
    local[size_t(i)] = hash_bytes(base + p.begin * element, p.size() * element);
  }
  std::vector<uint64_t> all(size_t(count) * size_t(n));
  CollectiveOptions options{.algorithm = Algorithm::kRing};
  dp.all_gather(local.data(), all.data(), count * 2, DType::kI32, options);
  for (int64_t i = 0; i < count; ++i) {
    for (int r = 1; r < n; ++r) {
      const uint64_t theirs = all[size_t(r) * size_t(count) + size_t(i)];
      const uint64_t first = all[size_t(i)];
      if (theirs != first) {
        LATTICE_THROW(ValueError,
                      "replica check: parameter '{}' differs between dp rank 0 (hash {:016x}) and "
                      "dp rank {} (hash {:016x}) ---> HINT: the replicas diverged; every dp rank "
                      "must apply the same reduced gradients (same buckets, same optimizer state)",
                      names[size_t(i)], first, r, theirs);
      }
    }
  }
  return int(count);
}

}  // namespace lattice
