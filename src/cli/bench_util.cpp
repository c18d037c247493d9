#include "cli/bench_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "core/thread_budget.h"

namespace lattice::cli {

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five;
  in >> one >> five;
  return in ? fmt::format("{} (1 min) {} (5 min) on {} cores", one, five, available_cores())
            : "unknown";
}

DType parse_precision(const std::string& name) {
  if (name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  LATTICE_THROW(ValueError, "unknown precision '{}' ---> HINT: fp32 or bf16", name);
}

}  // namespace lattice::cli
