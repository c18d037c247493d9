#include "parallel/shard_spec.h"

#include <fmt/format.h>

#include "core/error.h"

namespace lattice {

Shape ShardSpec::local_shape(const Shape& global) const {
  if (replicated()) return global;
  LATTICE_CHECK(dim < global.rank(), "shard dim {} of a rank-{} tensor", dim, global.rank());
  std::vector<int64_t> dims = global.dims();
  int64_t extent = padding;
  for (const ShardPiece& p : pieces) {
    LATTICE_CHECK(p.begin >= 0 && p.length >= 0 && p.begin + p.length <= global[dim],
                  "shard piece [{}, {}) outside dim {} of {}", p.begin, p.begin + p.length, dim,
                  global.to_string());
    extent += p.length;
  }
  dims[size_t(dim)] = extent;
  return Shape(std::move(dims));
}

std::string ShardSpec::describe() const {
  if (replicated()) return "replicated";
  std::string text = fmt::format("dim {}", dim);
  for (size_t i = 0; i < pieces.size(); ++i) {
    text += fmt::format("{}[{}, {})", i == 0 ? " " : " + ", pieces[i].begin,
                        pieces[i].begin + pieces[i].length);
  }
  if (padding > 0) text += fmt::format(" +{} pad", padding);
  return text;
}

ShardSpec replicated_shard() {
  return ShardSpec{};
}

ShardSpec split_shard(int dim, int64_t extent, int size, int rank, const std::string& what) {
  if (extent % size != 0) {
    LATTICE_THROW(ConfigError,
                  "{} ({}) does not divide by the tensor-parallel size {} ---> HINT: choose a "
                  "--tp that divides {}",
                  what, extent, size, extent);
  }
  const int64_t part = extent / size;
  return ShardSpec{dim, {{part * rank, part}}, 0};
}

ShardSpec padded_split_shard(int dim, int64_t extent, int size, int rank) {
  const int64_t part = (extent + size - 1) / size;
  const int64_t begin = std::min(extent, part * rank);
  const int64_t end = std::min(extent, part * (rank + 1));
  return ShardSpec{dim, {{begin, end - begin}}, part - (end - begin)};
}

void for_each_shard_run(const Shape& global, const ShardSpec& spec, const ShardRunFn& fn) {
  if (spec.replicated()) {
    if (global.numel() > 0) fn(0, 0, global.numel());
    return;
  }
  const Shape local = spec.local_shape(global);
  // Row-major: `outer` blocks before the sharded dimension, `inner` elements after it.
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < spec.dim; ++d) outer *= global[d];
  for (int d = spec.dim + 1; d < global.rank(); ++d) inner *= global[d];
  const int64_t global_extent = global[spec.dim], local_extent = local[spec.dim];
  for (int64_t o = 0; o < outer; ++o) {
    int64_t local_at = 0;
    for (const ShardPiece& p : spec.pieces) {
      if (p.length > 0) {
        fn((o * global_extent + p.begin) * inner, (o * local_extent + local_at) * inner,
           p.length * inner);
      }
      local_at += p.length;
    }
  }
}

}  // namespace lattice
