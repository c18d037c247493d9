// Element-wise folding of one rank's contribution into another's: acc[i] = op(acc[i], src[i]).
// f32 and bf16 (bf16 compares and adds in fp32, then rounds back; the Communicator runs bf16 sums
// in an fp32 work buffer so partial sums are never rounded).
#pragma once

#include <cstdint>

#include "comm/comm_types.h"
#include "core/dtype.h"

namespace lattice {

void reduce_into(void* acc, const void* src, int64_t count, DType dtype, ReduceOp op);

}  // namespace lattice
