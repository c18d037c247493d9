#include "run/live_progress.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace lattice {

std::string format_duration(double seconds) {
  const int64_t s = int64_t(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string progress_bar(int64_t done, int64_t total, int width) {
  const int filled = total > 0 ? int(std::clamp<int64_t>(done * width / total, 0, width)) : 0;
  return fmt::format("[{}{}]", std::string(size_t(filled), '#'),
                     std::string(size_t(width - filled), '.'));
}

LiveProgress::LiveProgress(int64_t first_step, int64_t total_steps, bool terminal,
                           double straggler_factor)
    : first_step_(first_step),
      total_steps_(total_steps),
      terminal_(terminal),
      straggler_factor_(straggler_factor) {}

double LiveProgress::seconds_left(int64_t step) const {
  const int64_t done = step - first_step_;
  return done > 0 ? busy_seconds_ / double(done) * double(total_steps_ - step) : 0.0;
}

std::string LiveProgress::eta_suffix(const StepMetrics& m) const {
  if (m.step >= total_steps_) return "";
  return fmt::format(" | ETA {}", format_duration(seconds_left(m.step)));
}

void LiveProgress::clear_bar() const {
  if (terminal_) fmt::print("\r\033[K");
}

void LiveProgress::after_step(const StepMetrics& m, Communicator& world, bool line_follows) {
  busy_seconds_ += m.ms / 1e3;
  if (straggler_factor_ > 0 && world.size() > 1) {
    const float mine = float(m.busy_ms());
    std::vector<float> all(size_t(world.size()));
    world.all_gather(&mine, all.data(), 1, DType::kF32);
    if (world.rank() == 0) {
      streaks_.resize(all.size());
      for (size_t r = 0; r < all.size(); ++r) {
        std::vector<double> others;
        for (size_t o = 0; o < all.size(); ++o)
          if (o != r) others.push_back(all[o]);
        const double typical = median(others);
        if (!streaks_[r].observe(all[r], typical, straggler_factor_)) continue;
        clear_bar();
        spdlog::warn(
            "straggler: rank {} was busy {:.1f} ms in step {} against a median of {:.1f} ms on "
            "the other ranks ({:.1f}x, above elastic.straggler_factor = {} for {} steps); every "
            "rank waits for it ---> HINT: lattice doctor --env shows each rank's cores; look for "
            "another load on them",
            r, all[r], m.step, typical, all[r] / typical, straggler_factor_,
            StragglerStreak::kSteps);
      }
    }
  }
  if (terminal_ && world.rank() == 0 && !line_follows && m.step < total_steps_) {
    fmt::print("\r{} {}/{} | ETA {}", progress_bar(m.step, total_steps_), m.step, total_steps_,
               format_duration(seconds_left(m.step)));
    std::fflush(stdout);
  }
}

}  // namespace lattice
