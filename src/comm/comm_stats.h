// Per-rank statistics of one Communicator: for each collective and algorithm, calls, bytes and
// time, with algorithm bandwidth (bytes / time) and bus bandwidth (algbw times the nccl-tests
// factor, which makes algorithms and group sizes comparable against the link speed).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "comm/comm_types.h"

namespace lattice {

// nccl-tests' bus bandwidth factors: all_reduce 2(n-1)/n; reduce_scatter and all_gather
// (n-1)/n; broadcast and reduce 1 (PERFORMANCE.md of nccl-tests).
double bus_bandwidth_factor(Collective collective, int group_size);

// The bytes a call counts as its size, as nccl-tests does: the full vector for all_reduce,
// broadcast and reduce, the full (gathered / pre-scatter) vector for all_gather and
// reduce_scatter.
struct CollectiveTotals {
  uint64_t calls = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  double algbw() const { return seconds > 0 ? double(bytes) / seconds : 0; }  // bytes/s
};

class CommStats {
 public:
  explicit CommStats(int group_size = 1) : group_size_(group_size) {}
  void record(Collective collective, Algorithm algorithm, uint64_t bytes, double seconds);

  const CollectiveTotals& totals(Collective collective, Algorithm algorithm) const;
  CollectiveTotals totals(Collective collective) const;  // summed over algorithms
  double busbw(Collective collective) const;             // bytes/s
  // One line per (collective, algorithm) used: calls, bytes, time, algbw, busbw in GB/s.
  std::string report() const;

 private:
  int group_size_;
  std::array<std::array<CollectiveTotals, kAlgorithmCount>, kCollectiveCount> totals_{};
};

}  // namespace lattice
