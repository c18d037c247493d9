// Boxes of a global tensor: what a checkpoint shard holds (manifest format v3), and the copies
// between a shard's bytes and a rank's local tensor.
//
// A box is, per dimension, [offset, offset + length) of the global tensor (PyTorch DCP's chunk
// metadata): a tensor-parallel shard is one box per piece of its ShardSpec (three for GPT-2's
// c_attn q|k|v), whatever dimension it splits. A box of rank 1 on a tensor of another rank is a
// flat range instead: elements [offset, offset + length) of the tensor flattened row-major,
// the cut a ZeRO partition of the flat store makes and the only shard of format v2 (on a rank-1
// tensor both readings are the same elements). A scalar is treated as shape [1].
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "parallel/shard_spec.h"

namespace lattice {

struct ShardBox {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;

  static ShardBox flat(int64_t begin, int64_t end);  // elements [begin, end) flattened
  static ShardBox whole(const Shape& shape);         // the whole tensor as a box of its rank
  int rank() const { return int(offsets.size()); }
  int64_t numel() const;
  // A flat range of a tensor of shape `global` (rank 1 on a tensor of another rank).
  bool is_flat_range_of(const Shape& global) const;
  bool covers_whole(const Shape& global) const;
  std::string to_string() const;  // "[0:64, 96:112]"; a flat range "[128:4160)"

  bool operator==(const ShardBox&) const = default;
  auto operator<=>(const ShardBox&) const = default;
};

// The dimensions of `shape`, [1] for a scalar.
std::vector<int64_t> box_dims(const Shape& shape);

// The boxes (at most 2·rank - 1, each contiguous in row-major order) that tile elements
// [begin, end) of a tensor of `shape` flattened, in order.
std::vector<ShardBox> flat_range_boxes(const Shape& shape, int64_t begin, int64_t end);

// `box` as boxes of the tensor's rank (a flat range decomposed). ValueError naming `what` when
// the box has another rank or lies outside `global`.
std::vector<ShardBox> as_tensor_boxes(const ShardBox& box, const Shape& global,
                                      std::string_view what);

// The common part of two boxes of the same rank, nullopt when empty.
std::optional<ShardBox> intersect(const ShardBox& a, const ShardBox& b);

// Where a box's elements lie in memory: the element at global index i (inside `box`) is at
// base + Σ_d (i[d] - box.offsets[d]) · strides[d] elements of `dtype`. The last dimension is
// always contiguous (stride 1).
struct BoxPlacement {
  ShardBox box;  // of the tensor's rank
  std::vector<int64_t> strides;
  std::byte* base = nullptr;
  DType dtype = DType::kF32;

  // True when the elements are one contiguous row-major block of box.lengths.
  bool contiguous() const;
};

// The box's elements stored contiguously, row-major, at `base`.
BoxPlacement contiguous_placement(ShardBox box, std::byte* base, DType dtype);

// Copies the elements in src.box ∩ dst.box, converting the dtype when they differ (the caller
// decides whether that is allowed); returns how many were copied.
int64_t copy_overlap(const BoxPlacement& src, const BoxPlacement& dst);

// Where the parts of the global tensor that a rank's local tensor holds lie in `data`, which is
// elements [begin, end) of the local tensor (shape spec.local_shape(global)) flattened row-major
// (begin = 0, end = numel: the whole local tensor). One placement per piece of the spec and
// contiguous box of the range; padding lies in none of them.
std::vector<BoxPlacement> local_placements(const Shape& global, const ShardSpec& spec,
                                           const Tensor& data, int64_t begin, int64_t end);

}  // namespace lattice
