#include "cli/bench_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/thread_budget.h"
#include "core/timer.h"

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

}  // namespace lattice::cli
