// Published large-scale training runs, each cited to its paper, table and row, and the planner's
// prediction for the same model, cluster and layout (`lattice plan --validate-published`,
// docs/planner.md "Published runs").
//
// What a paper fixes is fixed (tp, pp, dp, recompute, sequence parallelism, the micro-batch where
// it is given); what it leaves out (the micro-batch, the schedule, v, the ZeRO stage) is searched
// among the features that run had, and the fastest layout the planner finds is the prediction.
#pragma once

#include <string>
#include <vector>

#include "plan/search.h"
#include "plan/training_setup.h"

namespace lattice::plan {

struct PublishedRun {
  std::string id;      // "korthikanti-175b-selective"
  std::string source;  // paper, table and row
  // How the published step time is known: "published" (the paper gives seconds per iteration)
  // or how it follows from the published throughput.
  std::string step_time_from;
  TrainingSetup setup;
  SearchConstraints layout;  // the published dimensions fixed, the rest searched
  double step_seconds = 0;   // published (or derived as step_time_from says)
  double published_mfu = 0;  // model FLOPs utilisation as the paper reports it (0: not reported)
  double published_hfu = 0;  // hardware FLOPs utilisation (recompute counted) as reported
  double published_tflops_per_device = 0;  // as the paper reports it (0: not reported)
  // This row measures its software profile's compute efficiency (software_efficiency_of) for
  // the rows that share the profile; its own error is 0 by construction and is left out of the
  // mean and the worst.
  bool calibration = false;
};

// The rows, in the order docs/planner.md lists them.
std::vector<PublishedRun> published_runs();

// The runtime.compute_efficiency at which the planner predicts `run`'s published step time (its
// software profile's share of the device's GEMM curve), in (0, 1]: 1 when even the full curve
// is slower than the published step. Narayanan et al.'s rows take it from their row 1.
double software_efficiency_of(const PublishedRun& run);

struct PublishedCheck {
  PublishedRun run;
  SearchResult search;  // ranked.front(): the prediction, when any layout fits
  bool fits() const { return !search.ranked.empty(); }
  double predicted_seconds() const;
  double error() const;  // (predicted − published) ÷ published; 0 when nothing fits
};

struct PublishedValidation {
  std::vector<PublishedCheck> checks;
  int accepted = 0;           // rows whose published layout fits
  int judged = 0;             // rows that fit and do not calibrate
  double mean_abs_error = 0;  // over the judged rows
  double max_abs_error = 0;
  std::string worst;  // the id of the worst row
};

PublishedValidation validate_published(const std::vector<PublishedRun>& runs);

}  // namespace lattice::plan
