// `lattice plan --validate`: the planner's predicted memory and step time of a few layouts
// next to real runs of them on this machine (docs/planner.md, "Validation").
#pragma once

#include <string>
#include <vector>

namespace lattice::cli {

struct PlanValidateArgs {
  // A trainer preset or a training config (.toml). The default has 4 layers, so that a
  // 2-stage interleaved pipeline (pp2 v2: 4 chunks) fits.
  std::string model = "shakespeare-char";
  int64_t layers = 0;              // > 0: override the model's layer count
  std::string cluster;             // a preset or profile; empty: the default (see below)
  int64_t global_batch = 8;        // sequences per step, split over dp
  int64_t seq = 0;                 // 0: the model's
  std::string precision = "fp32";  // the trainer's compute dtype: fp32 or bf16
  // Fit 2 cores with one thread per rank; dp, tp, sp, pp (every schedule), ZeRO-1/2/3, recompute.
  std::vector<std::string> layouts{
      "dp1tp1",    "dp2",    "tp2",     "tp2+sp",        "dp2+zero1",         "dp2+zero2",
      "dp2+zero3", "rc-sel", "rc-full", "tp2+sp+rc-sel", "dp2+zero1+rc-full", "pp2",
      "pp2+gpipe", "pp2+zb", "pp2+v2",  "pp2+rc-full"};
  int64_t micro_batches = 4;  // per step in pp layouts without mb<N> (others: 1 per dp rank)
  int steps = 5;              // timed steps per layout
  int warmup = 2;             // untimed steps first
  int rounds = 1;   // run the whole list this many times; the step time is the median of all
  int threads = 1;  // per rank: a calibrated profile's device is one rank of --threads cores
  // Run layouts with more ranks × threads than cores (memory is still exact; their step times
  // measure the contention, and the report says so).
  bool oversubscribe = false;
  std::string data;  // a directory with train.bin; empty: synthetic tokens in a temporary one
  double time_factor = 1.15;  // issue 9's target: step time within 15%
  bool json = false;
};

// Runs the layouts, prints the table (or JSON); throws when a layout cannot run. Returns the
// number of flagged rows.
int run_plan_validate(const PlanValidateArgs& args);

}  // namespace lattice::cli
