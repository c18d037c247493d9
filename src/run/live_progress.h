// What a person watching `lattice train` sees between the progress lines: on a terminal a bar
// with the steps done and the time left, redrawn every step (plain lines when stdout is not a
// terminal: a log file gets the progress lines only); the time left on every progress line; and
// a one-line warning when a rank straggles (world rank 0 gathers every rank's busy time each
// step: StepMetrics::busy_ms).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/statistics.h"
#include "train/trainer.h"

namespace lattice {

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

// "[##########..........]" of `width` characters for done / total.
std::string progress_bar(int64_t done, int64_t total, int width = 24);

class LiveProgress {
 public:
  // `terminal`: stdout is a terminal (redraw a bar in place). `straggler_factor` <= 0: no
  // straggler watch (the elastic agent watches under lattice launch).
  LiveProgress(int64_t first_step, int64_t total_steps, bool terminal, double straggler_factor);

  // After step m on every rank of `world` (collective when the watch is on): the straggler
  // warning on world rank 0, and on a terminal the bar, unless a progress line follows.
  void after_step(const StepMetrics& m, Communicator& world, bool line_follows);
  // " | ETA 3m05s" for the progress line of step m (empty after the last step).
  std::string eta_suffix(const StepMetrics& m) const;
  // Clears the bar before a line is printed over it.
  void clear_bar() const;

 private:
  double seconds_left(int64_t step) const;

  int64_t first_step_, total_steps_;
  bool terminal_;
  double straggler_factor_;
  double busy_seconds_ = 0;  // the steps' wall time so far
  std::vector<StragglerStreak> streaks_;
};

}  // namespace lattice
