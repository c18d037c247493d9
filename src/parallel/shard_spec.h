// How one rank's local tensor is cut from a parameter's global tensor.
//
// Along `dim` the local tensor is the concatenation of `pieces` (each a range of the global
// dimension) followed by `padding` zero entries; every other dimension is whole. A replicated
// tensor (dim < 0) is the global tensor itself. One piece covers the ordinary Megatron splits
// (rows of a vocab-parallel table, columns of a column-parallel weight); several pieces cover
// fused weights such as GPT-2's c_attn, whose q, k and v columns are split separately; padding
// covers a vocabulary that does not divide by the tensor-parallel size.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/shape.h"

namespace lattice {

struct ShardPiece {
  int64_t begin = 0;  // along the sharded dimension of the global tensor
  int64_t length = 0;
};

struct ShardSpec {
  int dim = -1;  // < 0: replicated
  std::vector<ShardPiece> pieces;
  int64_t padding = 0;  // zero entries appended along dim (never part of the global tensor)

  bool replicated() const { return dim < 0; }
  Shape local_shape(const Shape& global) const;
  // "replicated", "dim 1 [0, 32)", "dim 1 [0, 32) + [64, 80) + [96, 112)", "dim 0 [86, 172) +2 pad"
  std::string describe() const;
};

ShardSpec replicated_shard();
// Part `rank` of `size` equal parts of a dimension of `extent`; ConfigError unless size divides it.
ShardSpec split_shard(int dim, int64_t extent, int size, int rank, const std::string& what);
// Part `rank` of ceil(extent / size)-sized parts, the last ones padded to that size.
ShardSpec padded_split_shard(int dim, int64_t extent, int size, int rank);

// Calls fn(global_index, local_index, count) for every contiguous run of elements that the local
// tensor (row-major, local_shape) takes from the global tensor (row-major, global). Padding is
// not visited.
using ShardRunFn = std::function<void(int64_t global_index, int64_t local_index, int64_t count)>;
void for_each_shard_run(const Shape& global, const ShardSpec& spec, const ShardRunFn& fn);

}  // namespace lattice
