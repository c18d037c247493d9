// `lattice launch -- train ... --transport mpi`: the static engine under the agent. MPI cannot
// rebuild a world around a lost rank, so recovery is restart-all: the agent runs the job as one
// `mpirun -np N`, and when it ends with an error (a rank died, stopped or threw: mpirun ends every
// rank, docs/elastic.md "The static engine") it runs it again with `--resume auto`, from the
// newest durable checkpoint under output.dir, up to --max-restarts times. SIGTERM is forwarded
// to mpirun (its ranks finish the step, checkpoint and exit 0).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace lattice {

struct StaticRelaunchOptions {
  int nproc = 1;
  int max_restarts = 3;
  double grace_s = 30;
  std::vector<std::string> command;  // train CONFIG [flags] (with --transport mpi)
  std::filesystem::path executable;  // the lattice binary
  // Where injected faults count their firings across relaunches (LATTICE_FAULT_DIR).
  std::filesystem::path fault_dir;
};

// Runs the job to its end; returns 0 when a run of it ended 0.
int run_static_relaunch(const StaticRelaunchOptions& options);

}  // namespace lattice
