#include "parallel/grad_buckets.h"

#include "core/error.h"

namespace lattice {

std::vector<GradBucket> plan_grad_buckets(const std::vector<FlatRange>& params,
                                          int64_t bucket_elements) {
  std::vector<GradBucket> buckets;
  int64_t expected = params.empty() ? 0 : params.front().begin;
  for (int i = 0; i < int(params.size()); ++i) {
    const FlatRange& p = params[size_t(i)];
    if (p.begin != expected || p.end < p.begin) {
      LATTICE_THROW(ValueError,
                    "plan_grad_buckets: parameter {} covers [{}, {}) but the flat layout expects "
                    "it to start at {} ---> HINT: list parameters in flat-buffer order",
                    i, p.begin, p.end, expected);
    }
    expected = p.end;
    const bool open =
        !buckets.empty() && (bucket_elements <= 0 || buckets.back().size() < bucket_elements);
    if (open) {
      buckets.back().end = p.end;
      buckets.back().end_param = i + 1;
    } else {
      buckets.push_back(GradBucket{p.begin, p.end, i, i + 1});
    }
  }
  return buckets;
}

}  // namespace lattice
