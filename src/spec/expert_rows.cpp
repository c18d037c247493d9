#include "spec/expert_rows.h"

#include <algorithm>
#include <bit>

namespace lattice {

int64_t padded_rows(int64_t rows) {
  if (rows <= 0) return 0;
  const int64_t step = std::max<int64_t>(8, int64_t(std::bit_floor(uint64_t(rows))) / 4);
  return (rows + step - 1) / step * step;
}

int64_t max_padded_rows(int64_t choices, int64_t experts) {
  return choices + choices / 4 + 8 * experts;
}

}  // namespace lattice
