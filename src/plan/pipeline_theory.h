// What a pipeline schedule costs in theory (cost-model reference; the pipeline issue's
// schedules): the bubble and how many micro-batches' activations a stage holds at its peak.
#pragma once

#include <cstdint>

#include "plan/layout.h"

namespace lattice::plan {

// Idle time ÷ ideal compute time with equal forward and backward costs: (p−1)/m for GPipe and
// 1F1B, (p−1)/(v·m) interleaved, (p−1)/(3m) ZB-H1. 0 when p == 1.
double bubble_ratio(Schedule schedule, int64_t p, int64_t m, int64_t v);
// The same bubble as a share of the step's wall time: ratio / (1 + ratio), e.g. (p−1)/(m+p−1).
double bubble_share_of_step(Schedule schedule, int64_t p, int64_t m, int64_t v);

// Model chunks (l/(p·v) layers each, one micro-batch) whose activations pipeline rank `stage`
// (0 = first) holds at its peak:
//   1F1B, ZB-H1: min(m, p − stage)              (ZB-H1 keeps 1F1B's peak, Qi et al. 2023)
//   GPipe:       m
//   interleaved: min(m·v, 2(p − stage − 1) + (v − 1)·p + 1)   (Megatron's warm-up count + 1;
//                on stage 0 that is l·(1 + (p−1)/(p·v)) layers' worth, Korthikanti et al.)
int64_t chunks_in_flight(Schedule schedule, int64_t p, int64_t m, int64_t v, int64_t stage);

}  // namespace lattice::plan
