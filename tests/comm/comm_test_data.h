// Verifiable data for collective tests (nccl-tests style): every element depends on the rank
// and the index and is a small integer, exactly representable in f32 and bf16, whose sums over
// up to 8 ranks stay exact; results are compared bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"

namespace lattice::testing {

// Contribution of `rank` at `index`: in [-16, 16], so a sum over 8 ranks stays within bf16's
// exact integers (|x| <= 256).
inline float contribution(int rank, int64_t index) {
  return float(int((index * 7 + rank * 13 + index / 5) % 33) - 16);
}

// Bytes of `count` elements of `dtype` holding the given float values.
inline std::vector<std::byte> encode(const std::vector<float>& values, DType dtype) {
  std::vector<std::byte> out(values.size() * dtype_size(dtype));
  if (!values.empty())
    convert(values.data(), DType::kF32, out.data(), dtype, int64_t(values.size()));
  return out;
}

inline std::vector<float> contributions(int rank, int64_t begin, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[size_t(i)] = contribution(rank, begin + i);
  return v;
}

// The index of the first differing element, or -1.
inline int64_t first_mismatch(const std::vector<std::byte>& a, const std::vector<std::byte>& b,
                              DType dtype) {
  if (a.size() != b.size()) return 0;
  size_t es = dtype_size(dtype);
  for (size_t i = 0; i < a.size(); i += es) {
    if (std::memcmp(&a[i], &b[i], es) != 0) return int64_t(i / es);
  }
  return -1;
}

}  // namespace lattice::testing
