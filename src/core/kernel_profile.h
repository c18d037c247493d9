// Where a step's time goes, kernel by kernel (`lattice bench train --profile`): each kernel
// entry point and each of the model's GEMMs (by role: "gemm attn.c_attn fwd", "... dx", "... dw")
// holds a KernelTimer, which adds its wall time, FLOPs and bytes moved to the calling thread's
// KernelProfile while a ScopedKernelProfile is installed there. Without one a timer costs one
// thread-local load. Timers nest: only the outermost one counts, so a kernel that calls another
// (attention's internal GEMMs, a cast inside a copy) is booked once, under the caller's name.
#pragma once

#include <chrono>
#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace lattice {

// One GEMM as `lattice::matmul` was asked for it: out (M, N) = op(a) (M, K) · op(b) (K, N), so
// that a benchmark can time the same problem alone, in the same library, beside the step's.
struct GemmProblem {
  int64_t m = 0, k = 0, n = 0;
  bool transpose_a = false;  // a stored (K, M)
  bool transpose_b = false;  // b stored (N, K)
  bool accumulate = false;
  bool bias = false;
  DType input = DType::kF32;
  DType output = DType::kF32;

  double flops() const { return 2.0 * double(m) * double(k) * double(n); }
  auto operator<=>(const GemmProblem&) const = default;
};

struct KernelTotals {
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // arithmetic the calls did (0: memory-bound, judged by bytes)
  double bytes = 0;  // bytes they read and wrote
  std::map<GemmProblem, int64_t> gemm_problems;  // the GEMMs inside the calls, and how often
};

class KernelProfile {
 public:
  void add(std::string_view name, double seconds, double flops, double bytes);
  void add_gemm_problem(std::string_view name, const GemmProblem& problem);
  const std::map<std::string, KernelTotals, std::less<>>& totals() const { return totals_; }
  void clear() { totals_.clear(); }

 private:
  KernelTotals& entry(std::string_view name);
  std::map<std::string, KernelTotals, std::less<>> totals_;
};

// Installs `profile` on the calling thread for its lifetime (and restores the previous one).
class ScopedKernelProfile {
 public:
  explicit ScopedKernelProfile(KernelProfile& profile);
  ~ScopedKernelProfile();
  ScopedKernelProfile(const ScopedKernelProfile&) = delete;
  ScopedKernelProfile& operator=(const ScopedKernelProfile&) = delete;

 private:
  KernelProfile* previous_;
};

// Books a GEMM the calling thread runs under its outermost open timer (no-op when not
// profiling); `lattice::matmul` calls it for every problem.
void note_gemm_problem(const GemmProblem& problem);

class KernelTimer {
 public:
  explicit KernelTimer(std::string_view name, double flops = 0, double bytes = 0);
  ~KernelTimer();
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;

 private:
  bool counted_ = false;              // profiling: this timer is in the nesting depth
  KernelProfile* profile_ = nullptr;  // null: not profiling, or nested in another timer
  std::string_view name_;
  double flops_ = 0;
  double bytes_ = 0;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace lattice
