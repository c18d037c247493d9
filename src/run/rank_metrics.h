// Every rank's metrics of every step, one JSON object per line in
// <output.dir>/metrics/rank_NNNNN.jsonl (docs/observability.md): the step's loss, LR, grad norm,
// time and where it went (forward, backward, optimizer, exposed communication, pipeline idle),
// tokens/s and MFU, the arena's live and peak bytes per category and its fragmentation, and per
// group and collective what the step carried: calls, bytes, seconds, algbw and busbw, the
// algorithm the tuner chose and, with a calibrated profile (parallel.comm_profile), the share of
// the profile's speed reached.
#pragma once

#include <filesystem>
#include <optional>
#include <vector>

#include "comm/comm_stats.h"
#include "comm/cost_model.h"
#include "core/arena.h"
#include "parallel/device_mesh.h"
#include "train/metrics_log.h"
#include "train/trainer.h"

namespace lattice {

// The file of world rank `rank` under a run directory.
std::filesystem::path rank_metrics_path(const std::filesystem::path& run_dir, int rank);

// <run_dir>/metrics/run.json: what the records belong to (model, steps, the layout, where the
// traces went), written once by world rank 0; read_run_info returns {} where there is none.
void write_run_info(const std::filesystem::path& run_dir, const nlohmann::json& info);
nlohmann::json read_run_info(const std::filesystem::path& run_dir);

// A run directory's records read back: records[rank] holds that rank's records in step order
// (a torn last line, of a run killed while writing, is skipped). IoError naming the directory
// and the fix when it holds no metrics.
struct RunMetrics {
  std::vector<std::vector<nlohmann::json>> records;
  nlohmann::json info = nlohmann::json::object();  // run.json
};
RunMetrics read_run_metrics(const std::filesystem::path& run_dir);

class RankMetrics {
 public:
  // Continues the file after `continue_after` steps (a resume or a restart from a snapshot).
  // `profile`: the calibrated models the busbw is compared with; empty: no share recorded.
  RankMetrics(const std::filesystem::path& run_dir, DeviceMesh& mesh, const Arena& arena,
              int64_t continue_after, CostProfile profile = {});
  void write(const StepMetrics& m, double peak_flops);
  // What the records cost this rank: seconds spent in write(), and the steps' own seconds.
  double write_seconds() const { return write_seconds_; }
  double step_seconds() const { return step_seconds_; }

 private:
  struct Group {
    const Communicator* comm;
    CommStats before;  // the totals at the end of the previous step
  };
  MetricsLog log_;
  int rank_;
  MeshCoordinates at_;
  const Arena& arena_;
  CostProfile profile_;
  std::vector<Group> groups_;
  double write_seconds_ = 0.0;
  double step_seconds_ = 0.0;
};

}  // namespace lattice
