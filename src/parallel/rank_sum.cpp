#include "parallel/rank_sum.h"

namespace lattice {

std::vector<double> sum_over_ranks(Communicator& group, const std::vector<double>& values) {
  static_assert(sizeof(double) == 2 * sizeof(int32_t));
  const int64_t count = int64_t(values.size());
  std::vector<double> all(values.size() * size_t(group.size()));
  // A gather only moves bytes: each double travels as two i32 words, unchanged.
  group.all_gather(values.data(), all.data(), count * 2, DType::kI32);
  std::vector<double> sums(values.size(), 0.0);
  for (int r = 0; r < group.size(); ++r) {
    for (int64_t i = 0; i < count; ++i) sums[size_t(i)] += all[size_t(r * count + i)];
  }
  return sums;
}

}  // namespace lattice
