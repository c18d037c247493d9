#include "train/lr_schedule.h"

#include <cmath>

namespace lattice {

float LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return max_lr * float(step + 1) / float(warmup_steps);
  if (step >= decay_steps) return min_lr;
  double progress = double(step - warmup_steps) / double(decay_steps - warmup_steps);
  double coefficient = 0.5 * (1.0 + std::cos(M_PI * progress));
  return float(min_lr + coefficient * (max_lr - min_lr));
}

}  // namespace lattice
