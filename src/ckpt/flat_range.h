// A contiguous range [begin, end) of a rank's flat parameter store, the unit a ZeRO rank owns
// (parallel/zero_shards.h), mapped to checkpoint pieces: every parameter overlapping the range
// contributes the overlap of its master weights and of both AdamW moments. Under tensor
// parallelism the store holds local shards, so the overlap is a range of the local tensor and
// becomes boxes of the global tensor (one per ShardSpec piece and contiguous part; padding is
// never saved). Saving with these pieces and reading them back with any other range and tp
// layout is resharding over dp, tp and ZeRO stages.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ckpt/shard_reader.h"
#include "ckpt/shard_writer.h"
#include "core/arena.h"
#include "model/parameters.h"

namespace lattice {

// master: f32 (P), the whole local store (replicated over dp in ZeRO-1/2; only the range is
// written), or f32 (end - begin), the range's own (ZeRO-3: a rank holds just its range). m_range,
// v_range: f32 (end - begin), the moments of the range. The pieces borrow from them where
// contiguous, else are copied into `scratch` (a multi-piece tp shard such as c_attn's q|k|v;
// ValueError when that is needed and `scratch` is null). Parameters replicated over tp are included
// only when `with_replicated` (tp rank 0 writes them); a pipeline stage's tied copy of the token
// table (ParameterSpec::tied_copy) never is (the first stage writes the table). `keep`, when
// given, selects the parameters (expert parallelism writes dense and expert ones apart).
std::vector<OwnedShard> flat_range_shards(
    const ParameterRegistry& registry, const Tensor& master, const Tensor& m_range,
    const Tensor& v_range, int64_t begin, int64_t end, Arena* scratch = nullptr,
    bool with_replicated = true, const std::function<bool(const ParameterSpec&)>& keep = {});

// Reads master weights and moments of local store elements [begin, end) from a checkpoint
// written under any layout. Each output: f32 (end - begin). Store alignment padding between
// parameters is left as it is; vocabulary padding inside a shard is zeroed.
void read_flat_range(const CheckpointReader& reader, const ParameterRegistry& registry,
                     int64_t begin, int64_t end, const Tensor& master_range, const Tensor& m_range,
                     const Tensor& v_range);

// ConfigError when the model's parameters are tensor-parallel shards, for operations that need
// whole tensors in this process (a Hugging Face export of a live model).
void expect_unsharded_model(const ParameterRegistry& registry, std::string_view what,
                            std::string_view hint);

}  // namespace lattice
