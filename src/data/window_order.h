// The order in which a shuffled loader visits the windows of a token file in one epoch.
#pragma once

#include <cstdint>
#include <vector>

namespace lattice {

// A permutation of [0, windows), a pure function of (seed, epoch): Fisher-Yates driven by the
// Philox stream (seed, hash_name("data/shuffle/epoch/<epoch>")), so every rank, every restart
// and every layout computes the same order without communicating.
std::vector<uint32_t> shuffled_window_order(uint64_t seed, int64_t epoch, int64_t windows);

}  // namespace lattice
