#include "cli/bench_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "core/error.h"

namespace lattice::cli {

double median(std::vector<double> values) {
  LATTICE_CHECK(!values.empty(), "median of no values");
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five;
  in >> one >> five;
  return in ? fmt::format("{} (1 min) {} (5 min)", one, five) : "unknown";
}

DType parse_precision(const std::string& name) {
  if (name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  LATTICE_THROW(ValueError, "unknown precision '{}' ---> HINT: fp32 or bf16", name);
}

}  // namespace lattice::cli
