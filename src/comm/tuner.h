// Picks the algorithm for a kAuto call: the cheapest under the alpha-beta model (cost_model.h)
// at the call's size, and keeps the runtime evidence that the model has gone stale.
//
// Every rank of a group must pick the same algorithm for the same call, so the tuner is a pure
// function of (profile, group size, per-bucket scales); the scales only change through
// Communicator::retune_if_slow(), which agrees on the evidence with an all-reduce first.
// Sizes are bucketed by powers of two: a slow link at 4 MiB says little about 4 KiB.
#pragma once

#include <array>
#include <cstddef>
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
  // The bucket's window so far; resets it.
  WindowResult take_window(Collective collective, size_t bytes);
  // After a re-measure: scales the algorithm's model in this bucket to match `seconds`.
  void rescale(Collective collective, Algorithm algorithm, size_t bytes, double seconds);
  // After a re-measure: whether it switched the bucket's algorithm (resets or doubles its
  // window).
  void remeasured(Collective collective, size_t bytes, bool switched);

  void set_profile(CostProfile profile) { profile_ = std::move(profile); }
  // The size bucket of a call of `bytes`: windows, scales and re-measures are per bucket.
  static int bucket(size_t bytes);

 private:
  struct Window {
    int length = kWindow;
    int calls = 0;
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
};

}  // namespace lattice
