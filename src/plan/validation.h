// Predicted against measured: the planner's memory and step time of one layout next to what a
// real run of that layout used (`lattice plan --validate`, docs/planner.md "Validation").
//
// plan/ runs nothing (DESIGN.md): the measurement comes in as numbers (one rank's arena peak per
// category — the most loaded pipeline stage's —, the median step time;
// cli/plan_validate_command.cpp runs the steps) and this file
// only lines them up with the prediction, computes ratios and flags what is out of tolerance.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "plan/layout.h"
#include "plan/memory_model.h"
#include "plan/time_model.h"

namespace lattice::plan {

// What one rank of a real run used: peak bytes per arena category (core/arena.h) and the median
// seconds of a training step.
struct MeasuredRun {
  double parameters = 0;        // MemoryCategory::kParameters peak
  double gradients = 0;         // kGradients
  double optimizer_states = 0;  // kOptimizerState
  double activations = 0;       // kActivations (token batches, logits and scratch included)
  double other = 0;             // kWorkspace + kCommunication + kOther
  double total = 0;             // peak of all categories together (not the sum of the peaks)
  double step_seconds = 0;
};

// Accepted |predicted / measured − 1| per quantity; time is judged as a factor (max(r, 1/r)).
struct ValidationTolerance {
  // Parameters, gradients and optimizer states are exact counts; what differs is the runtime's
  // 16-element alignment of every tensor (at most 15 elements each) and of a ZeRO shard, under
  // 1% for the tiny presets.
  double model_states = 0.01;
  // With the runtime model 'lattice' the activation buffers are counted as the runtime
  // allocates them (lattice_activations.h), unpadded: a difference is a bug in one of the two.
  // (Korthikanti et al.'s model, runtime 'megatron', is 40% or more below it here.)
  double activations = 0.01;
  double total = 0.01;
  // Step time is judged as a factor either way; issue 9's target is 15%. What it cannot see: other
  // processes on a shared machine, tiny GEMMs far from the calibrated shapes, element-wise work
  // priced only as memory traffic (docs/planner.md, Validation).
  double time_factor = 1.15;
};

struct ValidationRow {
  std::string quantity;  // "parameters", ..., "step time"
  double predicted = 0;
  double measured = 0;
  bool is_time = false;  // seconds, judged as a factor; otherwise bytes, judged relative
  double tolerance = 0;  // the relative error or factor allowed
  double ratio() const { return measured > 0 ? predicted / measured : 0.0; }
  // Out of tolerance (a quantity predicted as 0 and measured as 0 is within).
  bool flagged() const;
};

struct LayoutValidation {
  std::string name;  // "dp2 zero1", "tp2 sp", ...
  Layout layout;
  int64_t stage = 0;  // the pipeline stage whose memory the rows compare
  MemoryBreakdown predicted_memory;
  TimeBreakdown predicted_time;
  MeasuredRun measured;
  std::vector<ValidationRow> rows;

  int flagged_count() const;
};

// The comparison rows of one layout: parameters, gradients, optimizer states, activations (the
// planner's stored activations + embedding inputs + logits + recompute working set), other
// (communication buffers and ZeRO-3 gathers against the arena's remaining categories), total
// (without the fragmentation allowance: the arena counts live bytes), step time.
LayoutValidation compare_layout(std::string name, const Layout& layout,
                                const MemoryBreakdown& memory, const TimeBreakdown& time,
                                const MeasuredRun& measured, const ValidationTolerance& tolerance);

// Pipeline layouts: one more row, the peak total over all stages (predicted: the most loaded
// stage's; measured: the highest arena peak of any rank), judged like the total.
void add_peak_over_stages(LayoutValidation& validation, double predicted, double measured,
                          double tolerance);

// A short name for a layout of the validation list: "dp1 tp1", "dp2", "tp2 sp", "dp2 zero1",
// "pp2", "pp2 gpipe", "pp2 v2", "pp2 zb", "dp2 rc-sel", "pp2 rc-full", "dp2 tp2 sp zero1".
std::string validation_layout_name(const Layout& layout);
// Parses such a name ("dp2", "tp2+sp", "dp2+zero1", "dp1tp1", "pp2+gpipe", "pp2+v2+mb2", ...):
// dp<N>, tp<N>, pp<N>, cp<N>, ep<N> (experts over N of the dp ranks), zero<K>, sp, a schedule
// (1f1b, gpipe, zb or zb-h1, v<N>: interleaved with N chunks per stage), rc-sel / rc-full, mb<N>.
// micro_batch is 0 unless mb<N> is given (the caller chooses). ConfigError naming the accepted
// form; whether the layout can run is check_layout's (evaluation.h).
Layout parse_validation_layout(const std::string& text);

// The table: one line per layout and quantity (predicted, measured, ratio, flag).
std::string format_validation(const std::vector<LayoutValidation>& layouts);
nlohmann::json to_json(const LayoutValidation& validation);

}  // namespace lattice::plan
