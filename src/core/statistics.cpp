#include "core/statistics.h"

#include <algorithm>
#include <ctime>
#include <numeric>

#include "core/error.h"

namespace lattice {

double median(std::vector<double> values) {
  LATTICE_CHECK(!values.empty(), "median of no values");
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double mean(const std::vector<double>& values) {
  LATTICE_CHECK(!values.empty(), "mean of no values");
  return std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
}

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return double(now.tv_sec) + 1e-9 * double(now.tv_nsec);
}

bool StragglerStreak::observe(double mine, double others_median, double factor, int steps) {
  length_ = others_median > 0 && mine > factor * others_median ? length_ + 1 : 0;
  if (length_ < steps || reported_) return false;
  reported_ = true;
  return true;
}

}  // namespace lattice
