// Small pieces every `lattice bench` subcommand prints or computes the same way.
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/statistics.h"

namespace lattice::cli {

// "load average 0.52 (1 min) 0.61 (5 min) on 2 cores; CPUs 0 and 1 55 ns apart (a cache line's
// round trip)": benchmarks print it at start and end, so a reader can tell a quiet run from a
// contended one, and CPUs on one die from CPUs a host placed apart (core/core_latency.h).
std::string machine_state();
// "fp32" or "bf16" (ValueError naming the choices otherwise).
DType parse_precision(const std::string& name);
// The best of 5 single-thread memcpy calls of `bytes` (pages faulted in first), in seconds: the
// memory baseline the benchmarks print beside their rates.
double memcpy_seconds(size_t bytes);

// What every benchmark of training steps per layout takes (bench tp, cp, moe): the model, the
// step's shape, how many steps, the numerics.
struct StepBenchOptions {
  std::string preset;
  int64_t batch = 0;  // sequences per step
  int64_t seq = 0;    // tokens per sequence
  int steps = 5;
  int warmup = 2;
  std::string precision = "fp32";
  int threads = 1;  // per rank
  uint64_t seed = 1337;
  float lr = 1e-4f;
};
// Registers --preset, --batch, --seq, --steps, --warmup, --precision, --threads and --seed.
void add_step_bench_options(CLI::App& cmd, StepBenchOptions& options,
                            const std::string& preset_help,
                            const std::string& batch_help = "sequences per step");

}  // namespace lattice::cli
