#include "ckpt/shard_box.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace lattice {

namespace {

int64_t product(const std::vector<int64_t>& v, size_t first = 0) {
  int64_t n = 1;
  for (size_t i = first; i < v.size(); ++i) n *= v[i];
  return n;
}

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) strides[d - 1] = strides[d] * dims[d];
  return strides;
}

// Appends the boxes tiling elements [begin, end) of the sub-tensor dims[d..] at index `prefix`
// of dims[0..d).
void decompose(const std::vector<int64_t>& dims, size_t d, std::vector<int64_t>& prefix,
               int64_t begin, int64_t end, std::vector<ShardBox>& out) {
  if (begin >= end) return;
  auto box_of = [&](int64_t first, int64_t count) {
    ShardBox box;
    box.offsets = prefix;
    box.lengths.assign(prefix.size(), 1);
    box.offsets.push_back(first);
    box.lengths.push_back(count);
    for (size_t k = d + 1; k < dims.size(); ++k) {
      box.offsets.push_back(0);
      box.lengths.push_back(dims[k]);
    }
    return box;
  };
  if (d + 1 == dims.size()) {
    out.push_back(box_of(begin, end - begin));
    return;
  }
  const int64_t inner = product(dims, d + 1);
  const int64_t row_begin = begin / inner, row_end = end / inner;
  auto within_row = [&](int64_t row, int64_t b, int64_t e) {
    prefix.push_back(row);
    decompose(dims, d + 1, prefix, b, e, out);
    prefix.pop_back();
  };
  if (row_begin == row_end) {
    within_row(row_begin, begin - row_begin * inner, end - row_begin * inner);
    return;
  }
  int64_t full_first = row_begin;
  if (begin % inner != 0) {
    within_row(row_begin, begin % inner, inner);
    full_first = row_begin + 1;
  }
  if (row_end > full_first) out.push_back(box_of(full_first, row_end - full_first));
  if (end % inner != 0) within_row(row_end, 0, end % inner);
}

int64_t ravel(const std::vector<int64_t>& index, const std::vector<int64_t>& strides) {
  int64_t at = 0;
  for (size_t d = 0; d < index.size(); ++d) at += index[d] * strides[d];
  return at;
}

}  // namespace

ShardBox ShardBox::flat(int64_t begin, int64_t end) {
  return ShardBox{{begin}, {end - begin}};
}

ShardBox ShardBox::whole(const Shape& shape) {
  std::vector<int64_t> dims = box_dims(shape);
  return ShardBox{std::vector<int64_t>(dims.size(), 0), dims};
}

int64_t ShardBox::numel() const {
  return product(lengths);
}

bool ShardBox::is_flat_range_of(const Shape& global) const {
  return rank() == 1 && int(box_dims(global).size()) != 1;
}

bool ShardBox::covers_whole(const Shape& global) const {
  if (rank() == 1) return offsets[0] == 0 && lengths[0] == global.numel();
  return *this == whole(global);
}

std::string ShardBox::to_string() const {
  std::string text = "[";
  for (int d = 0; d < rank(); ++d) {
    text += fmt::format("{}{}:{}", d == 0 ? "" : ", ", offsets[size_t(d)],
                        offsets[size_t(d)] + lengths[size_t(d)]);
  }
  return text + "]";
}

std::vector<int64_t> box_dims(const Shape& shape) {
  return shape.rank() == 0 ? std::vector<int64_t>{1} : shape.dims();
}

std::vector<ShardBox> flat_range_boxes(const Shape& shape, int64_t begin, int64_t end) {
  std::vector<int64_t> dims = box_dims(shape);
  LATTICE_CHECK(begin >= 0 && begin <= end && end <= product(dims),
                "flat range [{}, {}) outside a tensor of shape {}", begin, end, shape.to_string());
  std::vector<ShardBox> boxes;
  std::vector<int64_t> prefix;
  decompose(dims, 0, prefix, begin, end, boxes);
  return boxes;
}

std::vector<ShardBox> as_tensor_boxes(const ShardBox& box, const Shape& global,
                                      std::string_view what) {
  const std::vector<int64_t> dims = box_dims(global);
  if (box.rank() == 1 && dims.size() != 1) {
    if (box.offsets[0] < 0 || box.lengths[0] < 0 ||
        box.offsets[0] + box.lengths[0] > product(dims)) {
      LATTICE_THROW(ValueError, "{}: elements {} lie outside {} ({} elements)", what,
                    box.to_string(), global.to_string(), product(dims));
    }
    return flat_range_boxes(global, box.offsets[0], box.offsets[0] + box.lengths[0]);
  }
  if (size_t(box.rank()) != dims.size() || box.lengths.size() != box.offsets.size()) {
    LATTICE_THROW(ValueError,
                  "{}: box {} has rank {}, the tensor {} has rank {} (a box has one [offset, "
                  "length) per dimension, or one for a flat range)",
                  what, box.to_string(), box.rank(), global.to_string(), dims.size());
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    if (box.offsets[d] < 0 || box.lengths[d] < 0 || box.offsets[d] + box.lengths[d] > dims[d]) {
      LATTICE_THROW(ValueError, "{}: box {} lies outside {}", what, box.to_string(),
                    global.to_string());
    }
  }
  return {box};
}

std::optional<ShardBox> intersect(const ShardBox& a, const ShardBox& b) {
  LATTICE_CHECK_EQ(a.rank(), b.rank());
  ShardBox out;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
    if (lo >= hi) return std::nullopt;
    out.offsets.push_back(lo);
    out.lengths.push_back(hi - lo);
  }
  return out;
}

bool BoxPlacement::contiguous() const {
  int64_t expected = 1;
  for (size_t d = box.lengths.size(); d-- > 0;) {
    if (box.lengths[d] != 1 && strides[d] != expected) return false;
    expected *= box.lengths[d];
  }
  return true;
}

BoxPlacement contiguous_placement(ShardBox box, std::byte* base, DType dtype) {
  std::vector<int64_t> strides = row_major_strides(box.lengths);
  return BoxPlacement{std::move(box), std::move(strides), base, dtype};
}

int64_t copy_overlap(const BoxPlacement& src, const BoxPlacement& dst) {
  std::optional<ShardBox> common = intersect(src.box, dst.box);
  if (!common) return 0;
  const size_t rank = common->lengths.size();
  // Merge trailing dimensions that are contiguous in both into one run.
  size_t k = rank - 1;
  int64_t run = common->lengths[k];
  while (k > 0 && src.strides[k - 1] == src.strides[k] * common->lengths[k] &&
         dst.strides[k - 1] == dst.strides[k] * common->lengths[k]) {
    --k;
    run *= common->lengths[k];
  }
  const size_t src_size = dtype_size(src.dtype), dst_size = dtype_size(dst.dtype);
  std::vector<int64_t> index(rank, 0);  // within `common`, dims [0, k) iterated
  for (;;) {
    int64_t src_at = 0, dst_at = 0;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t global = common->offsets[d] + index[d];
      src_at += (global - src.box.offsets[d]) * src.strides[d];
      dst_at += (global - dst.box.offsets[d]) * dst.strides[d];
    }
    std::byte* from = src.base + size_t(src_at) * src_size;
    std::byte* to = dst.base + size_t(dst_at) * dst_size;
    if (src.dtype == dst.dtype) {
      std::memcpy(to, from, size_t(run) * src_size);
    } else {
      Tensor::borrow(to, Shape{run}, dst.dtype)
          .copy_from(Tensor::borrow(from, Shape{run}, src.dtype));
    }
    size_t d = k;
    while (d > 0) {
      --d;
      if (++index[d] < common->lengths[d]) break;
      index[d] = 0;
      if (d == 0) return common->numel();
    }
    if (k == 0) return common->numel();
  }
}

std::vector<BoxPlacement> local_placements(const Shape& global, const ShardSpec& spec,
                                           const Tensor& data, int64_t begin, int64_t end) {
  const Shape local = spec.local_shape(global);
  const std::vector<int64_t> global_dims = box_dims(global);
  const std::vector<int64_t> local_dims = box_dims(local);
  LATTICE_CHECK(data.numel() == end - begin, "local range [{}, {}) of {} with data {}", begin, end,
                local.to_string(), data.describe());
  // Each piece as (the box in local coordinates, the shift along spec.dim to global ones).
  struct Piece {
    ShardBox local;
    int64_t shift = 0;
  };
  std::vector<Piece> pieces;
  if (spec.replicated()) {
    pieces.push_back({ShardBox::whole(global), 0});
  } else {
    const size_t dim = size_t(spec.dim);
    int64_t local_at = 0;
    for (const ShardPiece& p : spec.pieces) {
      ShardBox box = ShardBox::whole(global);
      box.offsets[dim] = local_at;
      box.lengths[dim] = p.length;
      if (p.length > 0) pieces.push_back({std::move(box), p.begin - local_at});
      local_at += p.length;
    }
  }
  const std::vector<int64_t> strides = row_major_strides(local_dims);
  auto* base = static_cast<std::byte*>(data.raw_data());
  const size_t size = dtype_size(data.dtype());
  std::vector<BoxPlacement> out;
  for (const ShardBox& range_box : flat_range_boxes(local, begin, end)) {
    for (const Piece& piece : pieces) {
      std::optional<ShardBox> part = intersect(range_box, piece.local);
      if (!part) continue;
      std::byte* at = base + size_t(ravel(part->offsets, strides) - begin) * size;
      ShardBox in_global = *part;
      if (!spec.replicated()) in_global.offsets[size_t(spec.dim)] += piece.shift;
      out.push_back(BoxPlacement{std::move(in_global), strides, at, data.dtype()});
    }
  }
  return out;
}

}  // namespace lattice
