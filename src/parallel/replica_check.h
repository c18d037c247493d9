// Master-weight consistency across data-parallel replicas.
//
// Replicas that should hold the same parameters drift apart silently when one rank skips or
// reorders an update (a known failure mode: "diverging master weights"). The check hashes each
// parameter's bytes on every rank, all-gathers the hashes over the dp group and throws on every
// rank, naming the first parameter (in flat order) that differs and the ranks that disagree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "parallel/grad_buckets.h"

namespace lattice {

// FNV-1a (64-bit) over `count` bytes.
uint64_t hash_bytes(const unsigned char* bytes, int64_t count);

// FNV-1a over the bytes of `count` floats (bitwise identity, so -0.0 != 0.0 and NaN payloads
// count).
uint64_t hash_floats(const float* data, int64_t count);

// master: (P) of any dtype (the f32 master, or the bf16 compute copy when the master is sharded);
// params: each parameter's flat range; names: their global names.
// Throws ValueError when a parameter differs between replicas; returns the number checked.
int check_replicas(Communicator& dp, const Tensor& master, const std::vector<FlatRange>& params,
                   const std::vector<std::string>& names);

}  // namespace lattice
