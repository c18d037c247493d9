#include "core/kernel_profile.h"

namespace lattice {

namespace {
thread_local KernelProfile* current_profile = nullptr;
thread_local int timer_depth = 0;
}  // namespace

void KernelProfile::add(std::string_view name, double seconds, double flops, double bytes) {
  auto it = totals_.find(name);
  if (it == totals_.end()) it = totals_.emplace(std::string(name), KernelTotals{}).first;
  KernelTotals& t = it->second;
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
