#include "cli/bench_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <vector>

#include "cli/validators.h"
#include "core/core_latency.h"
#include "core/error.h"
#include "core/thread_budget.h"
#include "core/timer.h"

namespace lattice::cli {

std::string machine_state() {
  std::ifstream in("/proc/loadavg");
  std::string one, five;
  in >> one >> five;
  std::string state = in ? fmt::format("load average {} (1 min) {} (5 min) on {} cores", one, five,
                                       available_cores())
                         : std::string("load average unknown");
  // How far apart the first two CPUs are: a host that moved its virtual CPUs onto different
  // dies makes memory-bound kernels several times slower (core/core_latency.h).
  if (affinity_cpus().size() >= 2) {
    const CpuDistance d = first_cpus_distance();
    state += d.ns > 0 ? fmt::format("; CPUs {} and {} {:.0f} ns apart (a cache line's round trip)",
                                    d.cpu_a, d.cpu_b, d.ns)
                      : fmt::format("; CPUs {} and {}: round trip not measured", d.cpu_a, d.cpu_b);
  }
  return state;
}

DType parse_precision(const std::string& name) {
  if (name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  LATTICE_THROW(ConfigError, "unknown precision '{}' ---> HINT: fp32 or bf16", name);
}

double memcpy_seconds(size_t bytes) {
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  std::memcpy(dst.data(), src.data(), bytes);  // fault the pages in
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    Stopwatch w;
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::min(best, w.seconds());
  }
  return best;
}

void add_step_bench_options(CLI::App& cmd, StepBenchOptions& options,
                            const std::string& preset_help, const std::string& batch_help) {
  cmd.add_option("--preset", options.preset, preset_help);
  cmd.add_option("--batch", options.batch, batch_help)->check(positive_number());
  cmd.add_option("--seq", options.seq, "tokens per sequence")->check(positive_number());
  cmd.add_option("--steps", options.steps, "timed steps")->check(positive_number());
  cmd.add_option("--warmup", options.warmup, "untimed steps first")->check(non_negative_number());
  cmd.add_option("--precision", options.precision, "fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd.add_option("--threads", options.threads, "threads per rank")->check(positive_number());
  cmd.add_option("--seed", options.seed, "initialisation and token seed");
}

}  // namespace lattice::cli
