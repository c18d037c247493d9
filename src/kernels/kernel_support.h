// Internal helpers shared by the pointwise and row kernels (not part of the kernels API):
// dtype dispatch, fp32 load/store of f32/bf16 elements, row-parallel loops on the calling
// thread's budget, lane-split reductions the compiler can vectorise, and a vectorisable exp.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/kernel_profile.h"
#include "core/tensor.h"
#include "core/thread_budget.h"

namespace lattice::kernel {

// The bytes a kernel's tensors hold (its KernelTimer's traffic: each read or written once).
inline double bytes_of(std::initializer_list<const Tensor*> tensors) {
  double bytes = 0;
  for (const Tensor* t : tensors) bytes += t->defined() ? double(t->nbytes()) : 0.0;
  return bytes;
}

// ---- loads and stores: arithmetic is fp32, a result rounds once to its storage dtype ----

inline float load(float v) {
  return v;
}
inline float load(bf16 v) {
  return float(v);
}
template <class T>
inline T store_as(float v) {
  return from_float<T>(v);
}

// Calls f(p0, p1, ...) with typed data pointers (float* or bf16*) of the given tensors, one
// template instantiation per dtype combination. The caller has validated every dtype with
// expect_float_dtype, so anything else here is a bug.
template <class F, class... Ptrs>
void visit_floats_impl(F& f, std::tuple<Ptrs...> ptrs) {
  std::apply(f, ptrs);
}
template <class F, class... Ptrs, class... Rest>
void visit_floats_impl(F& f, std::tuple<Ptrs...> ptrs, const Tensor& t, const Rest&... rest) {
  if (t.dtype() == DType::kF32) {
    visit_floats_impl(f, std::tuple_cat(ptrs, std::tuple<float*>(t.data<float>())), rest...);
  } else {
    visit_floats_impl(f, std::tuple_cat(ptrs, std::tuple<bf16*>(t.data<bf16>())), rest...);
  }
}
template <class F, class... Tensors>
void visit_floats(F&& f, const Tensors&... tensors) {
  visit_floats_impl(f, std::tuple<>(), tensors...);
}

template <class P>
using Elem = std::remove_const_t<std::remove_pointer_t<P>>;

// ---- threading: the calling thread's budget (DESIGN.md invariant 7) ----

// Below this many elements of work a parallel region costs more than it saves.
inline constexpr int64_t kMinParallelWork = int64_t(1) << 15;

inline int threads_for(int64_t work) {
  return work < kMinParallelWork ? 1 : thread_budget();
}

#define LATTICE_KERNEL_PRAGMA_(x) _Pragma(#x)
#if defined(LATTICE_USE_OPENMP)
// `#pragma omp parallel for` over the loop that follows, with the team sized by threads_for.
// Static schedule: the same thread count always splits rows the same way.
#define LATTICE_PARALLEL_FOR(work) \
  LATTICE_KERNEL_PRAGMA_(omp parallel for schedule(static) num_threads(::lattice::kernel::threads_for(work)))
#else
#define LATTICE_PARALLEL_FOR(work)
#endif

// Rows folded into one partial sum by kernels that reduce over rows (parameter gradients).
// A fixed block size makes the summation order a function of the shape alone, so results are
// bitwise identical for any thread count.
inline constexpr int64_t kReductionRows = 32;

// ---- reductions split over lanes: independent accumulators the compiler keeps in one vector
// register (a single accumulator is a serial dependency it may not reorder without -ffast-math).
inline constexpr int kLanes = 16;

template <class Term>
inline float sum_lanes(int64_t n, Term&& term) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += term(i + j);
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += term(i);
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0];
}

template <class Term>
inline float max_lanes(int64_t n, Term&& term) {
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  float acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = kLowest;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      float v = term(i + j);
      acc[j] = v > acc[j] ? v : acc[j];
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    float v = term(i);
    acc[j] = v > acc[j] ? v : acc[j];
  }
  float best = kLowest;
  for (int j = 0; j < kLanes; ++j) best = acc[j] > best ? acc[j] : best;
  return best;
}

// ---- exp without libm calls, so loops around it vectorise (glibc's vector expf is only
// declared under -ffast-math). Cody-Waite reduction x = n·ln2 + r, |r| ≤ ln2/2, then the
// Cephes expf polynomial for e^r; max relative error ≈ 2e-7 over the normal range (tested in
// kernel_support_test.cpp).

// e^x = p · 2^n: returns p and sets n (a whole number). F is float, or a float vector
// (kernels/simd.h's exp_vec), which runs the same operations lane by lane. Beyond the clamps
// e^x is +inf or 0 in float anyway; a NaN compares false and clamps to -104, so the callers'
// float-to-int conversions never see one.
template <class F>
inline F exp_reduce(F x, F& n) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
  F clamped = x > -104.0f ? x : F{} + -104.0f;
  clamped = clamped < 89.0f ? clamped : F{} + 89.0f;
  n = (clamped * kLog2e + kRoundMagic) - kRoundMagic;
  F r = clamped - n * kLn2Hi;
  r = r - n * kLn2Lo;
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

// 2^n is applied as two factors 2^(n/2)·2^(n - n/2), each a valid normal float, so overflow to
// +inf and gradual underflow to 0 come out of the multiplication.
inline float exp_fast(float x) {
  float n;
  const float p = exp_reduce(x, n);
  int32_t k = int32_t(n);
  int32_t k_half = k >> 1;
  float scale_a = bits_float(uint32_t(k_half + 127) << 23);
  float scale_b = bits_float(uint32_t(k - k_half + 127) << 23);
  float result = p * scale_a * scale_b;
  return x != x ? x : result;  // NaN stays NaN
}

// sigmoid(x) = 1 / (1 + e^-x); saturates to 0 and 1 without NaN.
inline float sigmoid_fast(float x) {
  return 1.0f / (1.0f + exp_fast(-x));
}

// Rows of a tensor treated as (rows, last dim).
inline int64_t rows_of(const Tensor& t) {
  int64_t last = t.rank() == 0 ? 1 : t.dim(-1);
  return last == 0 ? 0 : t.numel() / last;
}

// A small parameter vector (weight, bias: C elements) as f32: the tensor's own data when it
// is f32, otherwise a converted copy (bounded workspace of C floats), or null when undefined.
class F32View {
 public:
  explicit F32View(const Tensor& t) {
    if (!t.defined()) return;
    if (t.dtype() == DType::kF32) {
      data_ = t.data<float>();
      return;
    }
    copy_.resize(size_t(t.numel()));
    convert(t.raw_data(), t.dtype(), copy_.data(), DType::kF32, t.numel());
    data_ = copy_.data();
  }
  const float* data() const { return data_; }

 private:
  std::vector<float> copy_;
  const float* data_ = nullptr;
};

}  // namespace lattice::kernel
