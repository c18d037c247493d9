// Sums of scalars over a group, exact in double and in rank order.
//
// The step's loss and squared gradient norm are partial sums on each dp rank. Reducing them
// with an f32 all-reduce would round them and let the algorithm choose the order; instead the
// doubles travel bit for bit (all-gather) and every rank adds them in rank order, so every rank
// gets the same, repeatable value.
#pragma once

#include <vector>

#include "comm/communicator.h"

namespace lattice {

// Returns, per value, Σ over the group's ranks in rank order. Every rank passes as many values.
std::vector<double> sum_over_ranks(Communicator& group, const std::vector<double>& values);

}  // namespace lattice
