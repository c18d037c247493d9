#include "comm/tuner.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace lattice {

Tuner::Tuner(TransportKind transport, int group_size, CostProfile profile)
    : group_size_(group_size), profile_(std::move(profile)) {
  candidates_ = {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree};
  if (transport == TransportKind::kMpi) candidates_.push_back(Algorithm::kNative);
}

const std::vector<Algorithm>& Tuner::candidates(Collective collective) const {
  if (collective == Collective::kAllToAll) return all_to_all_candidates_;
  return collective == Collective::kBarrier ? barrier_candidates_ : candidates_;
}

int Tuner::bucket(size_t bytes) {
  return bytes == 0 ? 0 : int(std::bit_width(bytes));
}

double Tuner::base_predict(Collective collective, Algorithm algorithm, size_t bytes) const {
  auto measured = profile_.find(collective, algorithm, group_size_);
  CostModel m = measured ? *measured : default_cost_model(collective, algorithm, group_size_);
  return m.predict(double(bytes));
}

double Tuner::predict(Collective collective, Algorithm algorithm, size_t bytes) const {
  double base = base_predict(collective, algorithm, bytes);
  auto it = scale_.find({collective, bucket(bytes), algorithm});
  return it == scale_.end() ? base : base * it->second;
}

Algorithm Tuner::choose(Collective collective, size_t bytes) const {
  if (auto it = chosen_.find({collective, bucket(bytes)}); it != chosen_.end()) return it->second;
  Algorithm best = candidates(collective).front();
  double best_time = std::numeric_limits<double>::infinity();
  for (Algorithm a : candidates(collective)) {
    double t = predict(collective, a, bytes);
    if (t < best_time) {  // ties keep the earlier candidate, identically on every rank
      best = a;
      best_time = t;
    }
  }
  return best;
}

bool Tuner::observe(Collective collective, Algorithm algorithm, size_t bytes, double seconds) {
  Window& w = windows_[{collective, bucket(bytes)}];
  w.measured_sum += seconds;
  w.predicted_sum += predict(collective, algorithm, bytes);
  ++w.calls;
  return w.calls >= w.length;
}

Tuner::WindowResult Tuner::take_window(Collective collective, size_t bytes) {
  Window& w = windows_[{collective, bucket(bytes)}];
  WindowResult result;
  if (w.cooldown > 0) {
    --w.cooldown;
  } else if (w.calls > 0 && w.predicted_sum > 0) {
    result.slowdown = w.measured_sum / w.predicted_sum;
    result.excess_seconds = (w.measured_sum - w.predicted_sum) / w.calls;
  }
  w.calls = 0;
  w.measured_sum = w.predicted_sum = 0;
  return result;
}

void Tuner::remeasured(Collective collective, size_t bytes, Algorithm before, Algorithm chosen) {
  const bool switched = before != chosen;
  chosen_[{collective, bucket(bytes)}] = chosen;
  Window& w = windows_[{collective, bucket(bytes)}];
  w.length = switched ? kWindow : std::min(2 * w.length, kMaxWindow);
  if (switched) w.cooldown = kCooldownWindows;
}

Algorithm Tuner::confirmed_choice(Algorithm in_use, const Timings& first,
                                  const std::function<double(Algorithm)>& measure_again,
                                  Timings& second) {
  const auto seconds_of = [](const Timings& timings, Algorithm a) {
    for (const auto& [algorithm, seconds] : timings) {
      if (algorithm == a) return seconds;
    }
    return std::numeric_limits<double>::infinity();
  };
  Algorithm fastest = in_use;
  for (const auto& [algorithm, seconds] : first) {
    if (seconds < seconds_of(first, fastest)) fastest = algorithm;  // ties keep the earlier
  }
  if (fastest == in_use ||
      !(seconds_of(first, fastest) < kSwitchGain * seconds_of(first, in_use))) {
    return in_use;
  }
  second.emplace_back(in_use, measure_again(in_use));
  second.emplace_back(fastest, measure_again(fastest));
  return seconds_of(second, fastest) < kSwitchGain * seconds_of(second, in_use) ? fastest : in_use;
}

void Tuner::rescale(Collective collective, Algorithm algorithm, size_t bytes, double seconds) {
  double base = base_predict(collective, algorithm, bytes);
  scale_[{collective, bucket(bytes), algorithm}] = base > 0 ? seconds / base : 1.0;
}

}  // namespace lattice
