// Where a step's time goes, kernel by kernel (`lattice bench train --profile`): each kernel
// entry point and each of the model's GEMMs (by role: "gemm attn.c_attn fwd", "... dx", "... dw")
// holds a KernelTimer, which adds its wall time, FLOPs and bytes moved to the calling thread's
// KernelProfile while a ScopedKernelProfile is installed there. Without one a timer costs one
// thread-local load. Timers nest: only the outermost one counts, so a kernel that calls another
// (attention's internal GEMMs, a cast inside a copy) is booked once, under the caller's name.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace lattice {

struct KernelTotals {
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // arithmetic the calls did (0: memory-bound, judged by bytes)
  double bytes = 0;  // bytes they read and wrote
};

class KernelProfile {
 public:
  void add(std::string_view name, double seconds, double flops, double bytes);
  const std::map<std::string, KernelTotals, std::less<>>& totals() const { return totals_; }
  void clear() { totals_.clear(); }

 private:
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
