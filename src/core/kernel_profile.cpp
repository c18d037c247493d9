#include "core/kernel_profile.h"

namespace lattice {

namespace {
thread_local KernelProfile* current_profile = nullptr;
thread_local int timer_depth = 0;
thread_local std::string_view open_timer_name;  // the outermost open timer's
}  // namespace

KernelTotals& KernelProfile::entry(std::string_view name) {
  auto it = totals_.find(name);
  if (it == totals_.end()) it = totals_.emplace(std::string(name), KernelTotals{}).first;
  return it->second;
}

void KernelProfile::add_gemm_problem(std::string_view name, const GemmProblem& problem) {
  ++entry(name).gemm_problems[problem];
}

void note_gemm_problem(const GemmProblem& problem) {
  if (current_profile == nullptr || timer_depth == 0) return;
  current_profile->add_gemm_problem(open_timer_name, problem);
}

void KernelProfile::add(std::string_view name, double seconds, double flops, double bytes) {
  KernelTotals& t = entry(name);
  ++t.calls;
  t.seconds += seconds;
  t.flops += flops;
  t.bytes += bytes;
}

ScopedKernelProfile::ScopedKernelProfile(KernelProfile& profile) : previous_(current_profile) {
  current_profile = &profile;
}

ScopedKernelProfile::~ScopedKernelProfile() {
  current_profile = previous_;
}

KernelTimer::KernelTimer(std::string_view name, double flops, double bytes) {
  if (current_profile == nullptr) return;
  counted_ = true;
  if (timer_depth++ > 0) return;  // nested: the outer timer books the time
  profile_ = current_profile;
  name_ = name;
  open_timer_name = name;
  flops_ = flops;
  bytes_ = bytes;
  start_ = std::chrono::steady_clock::now();
}

KernelTimer::~KernelTimer() {
  if (!counted_) return;
  --timer_depth;
  if (profile_ == nullptr) return;
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
  profile_->add(name_, elapsed.count(), flops_, bytes_);
}

}  // namespace lattice
