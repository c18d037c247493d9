#include "core/dtype.h"

#include <type_traits>

#include "core/error.h"
#include "core/thread_budget.h"

namespace lattice {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
  }
  LATTICE_THROW(ContractError, "dtype_size: unknown dtype {}", int(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "fp16" || name == "float16") return DType::kF16;
  if (name == "i32" || name == "int32") return DType::kI32;
  LATTICE_THROW(ValueError, "unknown dtype '{}' ---> HINT: use one of f32, bf16, f16, i32", name);
}

uint16_t fp16::from_float(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (after rounding) -> inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in half precision: scale into the subnormal grid with RNE.
    if (abs < 0x33000000u) return uint16_t(sign);  // rounds to zero
    uint32_t mantissa = (abs & 0x007fffffu) | 0x00800000u;
    int shift = 126 - int(abs >> 23);  // half = mantissa * 2^(exponent - 126)
    uint32_t half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1u);
    uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t rounded = abs + 0x0fffu + ((abs >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

float fp16::to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: value = mantissa * 2^-24.
    float v = float(mantissa) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

namespace {

float widen(float v) {
  return v;
}
float widen(bf16 v) {
  return float(v);
}
float widen(fp16 v) {
  return float(v);
}
template <class D>
D narrow(float v) {
  if constexpr (std::is_same_v<D, float>) {
    return v;
  } else {
    return D(v);
  }
}

// One tight loop per (source, destination) pair, so that the compiler vectorises it; split over
// the calling thread's budget when it is long (the bf16 compute copies of a whole model).
// Only a thread with a budget of its own (a rank's) splits: another (a comm thread) stays serial.
template <class S, class D>
void convert_elements(const S* src, D* dst, int64_t count) {
#if defined(LATTICE_USE_OPENMP)
  const int threads = thread_budget();
#pragma omp parallel for schedule(static) \
    num_threads(threads > 0 ? threads : 1) if (threads > 1 && count >= (int64_t(1) << 18))
#endif
  for (int64_t i = 0; i < count; ++i) dst[i] = narrow<D>(widen(src[i]));
}

template <class S>
void convert_from(const S* src, void* dst, DType dst_dtype, int64_t count) {
  switch (dst_dtype) {
    case DType::kF32:
      return convert_elements(src, static_cast<float*>(dst), count);
    case DType::kBF16:
      return convert_elements(src, static_cast<bf16*>(dst), count);
    case DType::kF16:
      return convert_elements(src, static_cast<fp16*>(dst), count);
    case DType::kI32:
      break;
  }
  LATTICE_THROW(DTypeError, "convert: destination dtype {} is not a float type",
                dtype_name(dst_dtype));
}

}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count) {
  switch (src_dtype) {
    case DType::kF32:
      return convert_from(static_cast<const float*>(src), dst, dst_dtype, count);
    case DType::kBF16:
      return convert_from(static_cast<const bf16*>(src), dst, dst_dtype, count);
    case DType::kF16:
      return convert_from(static_cast<const fp16*>(src), dst, dst_dtype, count);
    case DType::kI32:
      break;
  }
  LATTICE_THROW(DTypeError, "convert: source dtype {} is not a float type", dtype_name(src_dtype));
}

}  // namespace lattice
