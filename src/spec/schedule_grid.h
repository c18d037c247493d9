// A pipeline schedule drawn as text (issue 7 item 5, `lattice explain --schedule KIND`): one row
// per rank, one column per time unit of the simulated timeline, then the peak in-flight
// micro-batches per stage and the bubble fraction.
#pragma once

#include <string>

#include "spec/pipeline_schedule.h"

namespace lattice {

// Cells: "F3" forward of micro-batch 3, "B3" full backward, "b3" backward-input, "w3"
// backward-weight, "." idle; with v ≥ 2 the local chunk follows ("F3.1"). An instruction that
// lasts n time units fills n cells. Example (gpipe, p=2, m=2, unit costs):
//   gpipe schedule (p=2 m=2 v=1), 9 time units
//   rank 0 | F0 F1 .  .  .  B0 B0 B1 B1
//   rank 1 | .  F0 F1 B0 B0 B1 B1 .  .
//   peak in-flight micro-batches per stage: 2 2
//   bubble fraction per stage: 33.3% 33.3%; overall 33.3%
// `timeline` must come from simulate(schedule, ...); ValueError otherwise.
std::string render_schedule_grid(const Schedule& schedule, const Timeline& timeline);

}  // namespace lattice
