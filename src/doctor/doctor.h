// `lattice doctor`: one check per classic failure mode of distributed training (docs/doctor.md).
// Each check is a function of what the doctor was given: the config (its [parallel] layout
// included), the machine, optionally a checkpoint to resume from, and the probe's runs. A check
// whose input is missing says N/A and why.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "doctor/check.h"
#include "doctor/machine.h"
#include "doctor/probe.h"
#include "train/train_config.h"

namespace lattice::doctor {

// The run's largest per-layer GEMM shape class (the MLP's first projection of one micro-batch
// on one rank: M = micro-batch tokens ÷ cp, K = d_model, N = d_ff ÷ tp, each capped at 1024 /
// 4096 / 4096 so a call stays well under a second), in the run's precision on its threads per
// rank, timed in every GEMM library the build has (best of 5 calls each).
struct GemmLibraryTiming {
  int64_t m = 0, k = 0, n = 0;
  DType dtype = DType::kF32;
  int threads = 1;
  std::map<GemmLibrary, double> flops_per_s;
};
GemmLibraryTiming time_gemm_libraries(const TrainConfig& config, const MachineFacts& machine);

struct DoctorInput {
  TrainConfig config;  // as `lattice train` would run it: layout flags applied
  MachineFacts machine;
  bool oversubscribe = false;  // lattice train --oversubscribe: more in-process ranks than cores
  std::optional<std::filesystem::path> resume_from = {};  // a checkpoint the run resumes
  std::optional<std::filesystem::path> init_from = {};    // Hugging Face weights it starts from
  std::optional<ProbeResult> probe = {};                  // none: --no-probe (or --preflight)
  // Each RDMA port's port_xmit_wait over the probe (read_port_xmit_wait after − before); empty
  // where the machine has no RDMA port.
  std::map<std::string, int64_t> port_xmit_wait_during_probe = {};
  // Each NIC's pause-frame counters over the probe (read_pause_frames after − before, keyed
  // "iface/counter"); empty without ethtool or a NIC that reports them.
  std::map<std::string, int64_t> pause_frames_during_probe = {};
  // The run's GEMM in each library (time_gemm_libraries); none: not measured (--preflight).
  std::optional<GemmLibraryTiming> gemm_libraries = {};
};

// The checks in order, like ggml's op-test registry: an id, a title, whether it needs the probe,
// and the function.
struct DoctorCheck {
  std::string_view id;
  std::string_view title;
  bool needs_probe = false;
  CheckResult (*run)(const DoctorInput& input) = nullptr;
};
const std::vector<DoctorCheck>& doctor_checks();

// Every check on `input`, in registry order.
std::vector<CheckResult> run_checks(const DoctorInput& input);

// The probe steps' step time scaled to the whole config (model FLOPs per step, full over slice),
// seconds: the doctor's prediction of one step of `config` on the probed layout, the probe's
// one thread per rank (sharing `cores` when the ranks outnumber them) scaled to the run's
// thread budget as if threads scaled perfectly.
double predicted_step_seconds(const TrainConfig& config, const ProbeResult& probe, int cores);

}  // namespace lattice::doctor
