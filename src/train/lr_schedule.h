// Learning-rate schedule: linear warmup, then cosine decay to a floor (as nanoGPT and llm.c).
#pragma once

#include <cstdint>

namespace lattice {

struct LrSchedule {
  float max_lr = 1e-3f;
  float min_lr = 1e-4f;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 1;  // step at which the floor is reached (usually the last step)

  // lr for a step counted from 0: (step + 1) / warmup · max during warmup, then
  // min + ½(1 + cos(π·progress))·(max − min), and min after decay_steps.
  float at(int64_t step) const;
};

}  // namespace lattice
