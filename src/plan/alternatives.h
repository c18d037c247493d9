// Why the obvious alternatives to a recommended layout lose: each neighbour (one dimension
// changed, the device count kept by adjusting dp) and the plain data-parallel layout are
// evaluated, and the resource that binds is named — memory (→ more tp or zero), tp collectives
// crossing nodes (→ pp instead), bubbles (→ more micro-batches or interleaving), exposed
// data-parallel traffic, recomputation, smaller and less efficient GEMMs.
#pragma once

#include <string>
#include <vector>

#include "plan/evaluation.h"
#include "plan/training_setup.h"

namespace lattice::plan {

struct Alternative {
  std::string change;  // "tp 4 (dp 16)", "recompute none", "data parallel only"
  Evaluation evaluation;
  double slowdown = 0;  // alternative step ÷ recommended step (feasible alternatives)
  std::string verdict;  // why it loses, or that it ties
};

std::vector<Alternative> explain_alternatives(const TrainingSetup& setup,
                                              const Evaluation& recommended);

}  // namespace lattice::plan
