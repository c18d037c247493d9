// Element types and the 16-bit float formats Lattice stores.
//
// bf16 is the compute format for mixed precision (matmul inputs, activations); fp16 exists
// for storage only (loading Hugging Face F16 files). Arithmetic always happens in fp32:
// convert, compute, round back with round-to-nearest-even.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace lattice {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "f32", "bf16", "f16", "i32"
DType parse_dtype(std::string_view name);  // throws ValueError naming the valid choices

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bfloat16: the top 16 bits of an IEEE float32.
struct bf16 {
  uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return bits_float(uint32_t(bits) << 16); }

  static bf16 from_bits(uint16_t b) {
    bf16 v;
    v.bits = b;
    return v;
  }
  // Round to nearest, ties to even; NaN stays a (quiet) NaN.
  static uint16_t from_float(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return uint16_t((u + rounding) >> 16);
  }
};

// IEEE binary16, for storage only.
struct fp16 {
  uint16_t bits = 0;

  fp16() = default;
  explicit fp16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

// Maps C++ element types to DType, for Tensor::data<T>().
template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<bf16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<fp16> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};

// Loads any floating element as float; stores a float as T with RNE rounding.
inline float to_float(float v) {
  return v;
}
inline float to_float(bf16 v) {
  return float(v);
}
inline float to_float(fp16 v) {
  return float(v);
}
template <class T>
inline T from_float(float v) {
  return T(v);
}
template <>
inline float from_float<float>(float v) {
  return v;
}

// Converts count elements between floating dtypes (f32, bf16, f16).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count);

}  // namespace lattice
