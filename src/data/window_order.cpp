#include "data/window_order.h"

#include <fmt/format.h>

#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/philox.h"

namespace lattice {

std::vector<uint32_t> shuffled_window_order(uint64_t seed, int64_t epoch, int64_t windows) {
  LATTICE_CHECK(windows >= 0 && windows <= int64_t(UINT32_MAX), "window count {}", windows);
  LATTICE_CHECK_GE(epoch, 0);
  std::vector<uint32_t> order(static_cast<size_t>(windows));
  std::iota(order.begin(), order.end(), 0u);
  PhiloxStream stream(seed, hash_name(fmt::format("data/shuffle/epoch/{}", epoch)));
  // Fisher-Yates: position i swaps with a uniform j in [0, i].
  for (int64_t i = windows - 1; i > 0; --i) {
    uint64_t j = stream.next_below(uint64_t(i) + 1);
    std::swap(order[size_t(i)], order[size_t(j)]);
  }
  return order;
}

}  // namespace lattice
