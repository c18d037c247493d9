#include "plan/pipeline_theory.h"

#include <algorithm>

namespace lattice::plan {

double bubble_ratio(Schedule schedule, int64_t p, int64_t m, int64_t v) {
  if (p <= 1) return 0.0;
  const double idle = double(p - 1);
  switch (schedule) {
    case Schedule::kOneFOneB:
    case Schedule::kGpipe:
      return idle / double(m);
    case Schedule::kInterleaved1F1B:
      return idle / double(v * m);
    case Schedule::kZeroBubbleH1:
      return idle / (3.0 * double(m));
  }
  return idle / double(m);
}

double bubble_share_of_step(Schedule schedule, int64_t p, int64_t m, int64_t v) {
  double ratio = bubble_ratio(schedule, p, m, v);
  return ratio / (1.0 + ratio);
}

int64_t chunks_in_flight(Schedule schedule, int64_t p, int64_t m, int64_t v, int64_t stage) {
  if (p <= 1) return 1;  // gradient accumulation: one micro-batch's forward, then its backward
  switch (schedule) {
    case Schedule::kOneFOneB:
    case Schedule::kZeroBubbleH1:
      return std::min(m, p - stage);
    case Schedule::kGpipe:
      return m;
    case Schedule::kInterleaved1F1B:
      return std::min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1);
  }
  return m;
}

}  // namespace lattice::plan
