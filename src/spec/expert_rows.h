// How many rows a mixture-of-experts layer's expert blocks take (model/moe_router.h packs them):
// one definition for the runtime, which allocates them, and the planner, which prices them.
#pragma once

#include <cstdint>

namespace lattice {

// `rows` rounded up to a multiple of max(8, bit_floor(rows) / 4): at most 25% more, four sizes
// per octave.
int64_t padded_rows(int64_t rows);
// The most packed rows route_tokens(padded) can give for `choices` choices over E experts.
int64_t max_padded_rows(int64_t choices, int64_t experts);

}  // namespace lattice
