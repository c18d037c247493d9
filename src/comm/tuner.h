// Picks the algorithm for a kAuto call: the cheapest under the alpha-beta model (cost_model.h)
// at the call's size, and keeps the runtime evidence that the model has gone stale.
//
// Every rank of a group must pick the same algorithm for the same call, so the tuner is a pure
// function of (profile, group size, per-bucket scales and choices); they only change through
// Communicator::retune_if_slow(), which agrees on the evidence with an all-reduce first.
// Sizes are bucketed by powers of two: a slow link at 4 MiB says little about 4 KiB.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "comm/cost_model.h"

namespace lattice {

class Tuner {
 public:
  // Calls per size bucket between two checks of predicted against measured time; a re-measure
  // that keeps the algorithm doubles its bucket's window (up to kMaxWindow), a switch resets it:
  // a machine that is merely noisy is re-measured ever more rarely.
  static constexpr int kWindow = 8;
  static constexpr int kMaxWindow = 64 * kWindow;
  // A window whose mean measured / predicted time exceeds this triggers a re-measure...
  static constexpr double kSlowdownThreshold = 1.5;
  // ...when its calls also ran this much longer than predicted, each: scheduling noise makes
  // microsecond calls look slow, and re-measuring them costs more than they could save.
  static constexpr double kMinExcessSeconds = 100e-6;
  // Hysteresis against a noisy link: a re-measure switches only when the fastest candidate beats
  // the algorithm in use by this factor, and again when both are measured a second time (a gain
  // that noise made rarely survives it)...
  static constexpr double kSwitchGain = 0.8;
  // ...and after a switch the bucket's next windows are not judged (a cool-down): the new
  // algorithm runs this many windows before a re-measure may move it again.
  static constexpr int kCooldownWindows = 4;

  using Timings = std::vector<std::pair<Algorithm, double>>;  // seconds per call, by algorithm
  // The algorithm a re-measure keeps: `in_use`, unless the fastest of `first` beats it by
  // kSwitchGain there and in `measure_again` of both (called only then; appended to `second`).
  static Algorithm confirmed_choice(Algorithm in_use, const Timings& first,
                                    const std::function<double(Algorithm)>& measure_again,
                                    Timings& second);

  struct WindowResult {
    double slowdown = 1.0;        // mean measured / mean predicted time
    double excess_seconds = 0.0;  // mean measured - mean predicted time per call
    bool slow() const {
      return slowdown > kSlowdownThreshold && excess_seconds > kMinExcessSeconds;
    }
  };

  Tuner(TransportKind transport, int group_size, CostProfile profile = {});

  const std::vector<Algorithm>& candidates(Collective collective) const;
  Algorithm choose(Collective collective, size_t bytes) const;
  double predict(Collective collective, Algorithm algorithm, size_t bytes) const;  // seconds

  // Records a tuned call; returns true when it closes its bucket's window (on every rank at the
  // same call, since ranks make the same calls).
  bool observe(Collective collective, Algorithm algorithm, size_t bytes, double seconds);
  // The bucket's window so far; resets it. During a cool-down a window that closes is counted
  // off and reported as on time (never re-measured).
  WindowResult take_window(Collective collective, size_t bytes);
  // After a re-measure: scales the algorithm's model in this bucket to match `seconds`.
  void rescale(Collective collective, Algorithm algorithm, size_t bytes, double seconds);
  // After a re-measure: the bucket's algorithm from now on (`choose` returns it). A switch
  // resets its window and starts the cool-down; a kept algorithm doubles the window.
  void remeasured(Collective collective, size_t bytes, Algorithm before, Algorithm chosen);

  void set_profile(CostProfile profile) { profile_ = std::move(profile); }
  // The size bucket of a call of `bytes`: windows, scales and re-measures are per bucket.
  static int bucket(size_t bytes);

 private:
  struct Window {
    int length = kWindow;
    int calls = 0;
    int cooldown = 0;  // windows left before the bucket is judged again
    double measured_sum = 0;
    double predicted_sum = 0;
  };
  double base_predict(Collective collective, Algorithm algorithm, size_t bytes) const;

  int group_size_;
  CostProfile profile_;
  std::vector<Algorithm> candidates_;
  std::vector<Algorithm> barrier_candidates_{Algorithm::kTree};
  std::vector<Algorithm> all_to_all_candidates_{Algorithm::kPairwise};
  std::map<std::tuple<Collective, int, Algorithm>, double> scale_;  // (collective, bucket, algo)
  std::map<std::pair<Collective, int>, Window> windows_;
  std::map<std::pair<Collective, int>, Algorithm> chosen_;  // set by re-measures, per bucket
};

}  // namespace lattice
