// `lattice doctor --env`: what each rank of a launched job sees of its launch (the launcher's
// rank, size and local rank, its host, its CPU affinity and NUMA nodes, its thread budget, the
// devices it is given), gathered on every rank, and the checks rank 0 prints from all of them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/launch_env.h"
#include "doctor/check.h"

namespace lattice::doctor {

struct RankEnvironment {
  int rank = 0;   // in the communicator the doctor ran on
  int world = 1;  // its size
  std::string host;
  std::optional<LaunchEnvironment> launcher;  // OMPI_COMM_WORLD_*, PMI_*, SLURM_*; none by hand
  std::vector<int> cpus;                      // sched_getaffinity, ascending
  int numa_nodes_spanned = 1;
  int threads = 1;  // Lattice's thread budget of this rank
  std::optional<std::string> omp_num_threads;
  std::optional<std::string> cuda_visible_devices;
  int visible_gpus = -1;  // `nvidia-smi -L` lines where nvidia-smi exists, else -1
};

// This process as rank `rank` of `world`; `threads` its budget (0: the cores of its affinity).
RankEnvironment observe_rank_environment(int rank, int world, int threads);

nlohmann::json to_json(const RankEnvironment& env);
RankEnvironment rank_environment_from_json(const nlohmann::json& j);

// The checks of a job's ranks (every rank's environment, in rank order):
//   launcher: each launcher's rank and size equal the communicator's; local ranks on each host
//     are 0 .. n−1, once each;
//   affinity: the ranks on one host use disjoint cores, each at least its thread budget, each
//     on one NUMA node;
//   devices: CUDA_VISIBLE_DEVICES differs between the ranks of a host and names devices that
//     nvidia-smi lists (N/A where neither exists).
std::vector<CheckResult> check_rank_environments(const std::vector<RankEnvironment>& ranks);

}  // namespace lattice::doctor
