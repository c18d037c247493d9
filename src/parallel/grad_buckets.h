// Data-parallel gradient buckets: contiguous ranges of the flat gradient buffer, cut at parameter
// boundaries, each reduced over the dp group as one collective (PyTorch DDP's Reducer buckets).
//
// Buckets are a pure function of the parameter layout and the bucket size, so every rank of the
// dp group plans the same buckets and launches the same collectives in the same order.
#pragma once

#include <cstdint>
#include <vector>

namespace lattice {

// One parameter's elements [begin, end) of the flat buffer; parameters are listed in flat order.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

struct GradBucket {
  int64_t begin = 0;  // first element of the flat buffer
  int64_t end = 0;    // one past the last
  int first_param = 0;
  int end_param = 0;  // one past the last parameter index
  int64_t size() const { return end - begin; }
};

// Greedy in flat order: a bucket takes parameters while it holds fewer than bucket_elements;
// a parameter larger than that gets a bucket of its own. bucket_elements <= 0: one bucket.
// Throws ValueError when the parameters are not contiguous and ascending.
std::vector<GradBucket> plan_grad_buckets(const std::vector<FlatRange>& params,
                                          int64_t bucket_elements);

}  // namespace lattice
