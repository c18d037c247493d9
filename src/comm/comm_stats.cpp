#include "comm/comm_stats.h"

#include <fmt/format.h>

namespace lattice {

double bus_bandwidth_factor(Collective collective, int group_size) {
  const double n = group_size;
  switch (collective) {
    case Collective::kAllReduce:
      return 2 * (n - 1) / n;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
    case Collective::kAllToAll:
      return (n - 1) / n;
    default:
      return 1;
  }
}

void CommStats::record(Collective collective, Algorithm algorithm, uint64_t bytes, double seconds) {
  CollectiveTotals& t = totals_[size_t(collective)][size_t(algorithm)];
  ++t.calls;
  t.bytes += bytes;
  t.seconds += seconds;
}

const CollectiveTotals& CommStats::totals(Collective collective, Algorithm algorithm) const {
  return totals_[size_t(collective)][size_t(algorithm)];
}

CollectiveTotals CommStats::totals(Collective collective) const {
  CollectiveTotals sum;
  for (const auto& t : totals_[size_t(collective)]) {
    sum.calls += t.calls;
    sum.bytes += t.bytes;
    sum.seconds += t.seconds;
  }
  return sum;
}

double CommStats::busbw(Collective collective) const {
  return totals(collective).algbw() * bus_bandwidth_factor(collective, group_size_);
}

std::string CommStats::report() const {
  std::string out = fmt::format("{:<15} {:<7} {:>8} {:>14} {:>10} {:>10} {:>10}\n", "collective",
                                "algo", "calls", "bytes", "time(s)", "algbw", "busbw");
  for (int c = 0; c < kCollectiveCount; ++c) {
    for (int a = 0; a < kAlgorithmCount; ++a) {
      const CollectiveTotals& t = totals_[size_t(c)][size_t(a)];
      if (t.calls == 0) continue;
      double factor = bus_bandwidth_factor(Collective(c), group_size_);
      out += fmt::format("{:<15} {:<7} {:>8} {:>14} {:>10.4f} {:>10.3f} {:>10.3f}\n",
                         collective_name(Collective(c)), algorithm_name(Algorithm(a)), t.calls,
                         t.bytes, t.seconds, t.algbw() / 1e9, t.algbw() * factor / 1e9);
    }
  }
  return out;
}

}  // namespace lattice
