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
  if (w.calls > 0 && w.predicted_sum > 0) {
    result.slowdown = w.measured_sum / w.predicted_sum;
    result.excess_seconds = (w.measured_sum - w.predicted_sum) / w.calls;
  }
  w.calls = 0;
  w.measured_sum = w.predicted_sum = 0;
  return result;
}

void Tuner::remeasured(Collective collective, size_t bytes, bool switched) {
  Window& w = windows_[{collective, bucket(bytes)}];
  w.length = switched ? kWindow : std::min(2 * w.length, kMaxWindow);
}

void Tuner::rescale(Collective collective, Algorithm algorithm, size_t bytes, double seconds) {
  double base = base_predict(collective, algorithm, bytes);
  scale_[{collective, bucket(bytes), algorithm}] = base > 0 ? seconds / base : 1.0;
}

}  // namespace lattice
