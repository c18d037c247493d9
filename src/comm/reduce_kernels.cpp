#include "comm/reduce_kernels.h"

#include <algorithm>

#include "core/error.h"

namespace lattice {
namespace {

template <class T, class Combine>
void fold(void* acc, const void* src, int64_t count, Combine combine) {
  T* __restrict a = static_cast<T*>(acc);
  const T* __restrict s = static_cast<const T*>(src);
  for (int64_t i = 0; i < count; ++i) a[i] = combine(a[i], s[i]);
}

}  // namespace

void reduce_into(void* acc, const void* src, int64_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  switch (dtype) {
    case DType::kF32:
      if (op == ReduceOp::kSum) {
        fold<float>(acc, src, count, [](float a, float b) { return a + b; });
      } else {
        fold<float>(acc, src, count, [](float a, float b) { return std::max(a, b); });
      }
      return;
    case DType::kBF16:
      if (op == ReduceOp::kSum) {
        fold<bf16>(acc, src, count, [](bf16 a, bf16 b) { return bf16(float(a) + float(b)); });
      } else {
        fold<bf16>(acc, src, count, [](bf16 a, bf16 b) { return float(b) > float(a) ? b : a; });
      }
      return;
    default:
      LATTICE_THROW(DTypeError, "reduce_into: cannot reduce {} ---> HINT: reduce f32 or bf16",
                    dtype_name(dtype));
  }
}

}  // namespace lattice
