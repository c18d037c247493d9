// Process groups. A group's context (which keeps its messages apart from every other group's)
// is a hash of its parent's context, the parent's count of groups made so far and what defines
// the group, so every member derives the same context without talking.
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "comm/communicator.h"
#include "comm/hash_mix.h"

namespace lattice {
namespace {}  // namespace

Communicator Communicator::split(int color, int key, const CollectiveOptions& options) {
  // Everyone learns everyone's (color, key), then each rank keeps those with its color.
  std::vector<int32_t> mine{color, key};
  std::vector<int32_t> all(size_t(2 * size()));
  CollectiveOptions gather = options;
  gather.algorithm = Algorithm::kTree;
  all_gather(mine.data(), all.data(), 2, DType::kI32, gather);
  std::vector<int> ranks;
  for (int r = 0; r < size(); ++r) {
    if (all[size_t(2 * r)] == color) ranks.push_back(r);
  }
  std::stable_sort(ranks.begin(), ranks.end(),
                   [&](int a, int b) { return all[size_t(2 * a + 1)] < all[size_t(2 * b + 1)]; });
  const uint64_t context =
      hash_mix(hash_mix(hash_mix(context_, ++groups_made_), 0x5350u), uint64_t(color));
  std::vector<int> world;
  for (int r : ranks) world.push_back(members_[size_t(r)]);
  int new_rank = int(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  return Communicator(transport_, std::move(world), new_rank, context,
                      fmt::format("{}/split{}", name_, color), config_);
}

std::optional<Communicator> Communicator::new_group(const std::vector<int>& ranks) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (ranks.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
      sorted.front() < 0 || sorted.back() >= size()) {
    LATTICE_THROW(ValueError,
                  "new_group on group '{}': ranks {} must be distinct ranks of the group (0..{})",
                  name_, ranks, size() - 1);
  }
  uint64_t context = hash_mix(hash_mix(context_, ++groups_made_), 0x4e47u);
  for (int r : ranks) context = hash_mix(context, uint64_t(r));
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return std::nullopt;
  std::vector<int> world;
  for (int r : ranks) world.push_back(members_[size_t(r)]);
  return Communicator(transport_, std::move(world), int(me - ranks.begin()), context,
                      fmt::format("{}/group{}", name_, ranks), config_);
}

}  // namespace lattice
