// Per-step metrics: the progress line for people and one JSON object per line for machines.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "train/trainer.h"

namespace lattice {

// "step   12/2000 | loss 2.8123 | lr 1.00e-03 | grad-norm 1.234 | 11234 tok/s | 68.3 ms |
//  MFU 12.3%" (+ " | val 2.71" on evaluation steps). peak_flops: the MFU denominator.
std::string format_progress(const StepMetrics& m, int64_t total_steps, double peak_flops);

// Appends one JSON object per line and flushes it: a crash leaves every finished line (a torn
// last line is skipped by readers). write(m, peak) writes the run's summary record: step, loss,
// lr, grad_norm, tokens_per_s, ms, mfu and val_loss on evaluation steps.
class MetricsLog {
 public:
  // A new file; or, for a run that continues after `continue_after` steps (a resume, a restart
  // from a snapshot), the existing file's records of steps up to it, the later ones dropped (they
  // are trained again).
  explicit MetricsLog(const std::filesystem::path& path, int64_t continue_after = 0);
  void write(const StepMetrics& m, double peak_flops);
  void write(const nlohmann::json& record);

 private:
  std::ofstream out_;
};

}  // namespace lattice
