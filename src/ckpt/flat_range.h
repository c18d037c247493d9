// A contiguous range [begin, end) of the flat parameter store, the unit a ZeRO rank owns
// (parallel/zero_shards.h), mapped to checkpoint pieces: every parameter overlapping the range
// contributes the overlap of its master weights and of both AdamW moments. Saving with these
// pieces and reading them back with any other range is resharding over dp and ZeRO stages.
#pragma once

#include <cstdint>
#include <vector>

#include "ckpt/shard_reader.h"
#include "ckpt/shard_writer.h"
#include "model/parameters.h"

namespace lattice {

// master: f32 (P), the whole store (replicated over dp in ZeRO-1/2; only the range is written).
// m_range, v_range: f32 (end - begin), the moments of the range. The pieces borrow from them.
std::vector<OwnedShard> flat_range_shards(const ParameterRegistry& registry, const Tensor& master,
                                          const Tensor& m_range, const Tensor& v_range,
                                          int64_t begin, int64_t end);

// Reads master weights and moments of store elements [begin, end) from a checkpoint written
// under any layout. Each output: f32 (end - begin).
void read_flat_range(const CheckpointReader& reader, const ParameterRegistry& registry,
                     int64_t begin, int64_t end, const Tensor& master_range, const Tensor& m_range,
                     const Tensor& v_range);

// ConfigError when the model's parameters are tensor-parallel shards: checkpoints hold global
// tensors as flat element ranges, which a tp shard is not (resharding by tensor slices: issue 8).
void expect_unsharded_model(const ParameterRegistry& registry, std::string_view what);

}  // namespace lattice
