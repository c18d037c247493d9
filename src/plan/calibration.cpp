#include "plan/calibration.h"

#include <algorithm>

#include "core/error.h"

namespace lattice::plan {

namespace {

// Ring steps of an all-reduce of n ranks (reduce-scatter then all-gather): the unit of
// LinkSpec::alpha_s.
double ring_steps(int64_t n) {
  return 2.0 * double(n - 1);
}

}  // namespace

ClusterSpec calibrated_cluster(const MachineMeasurement& machine) {
  auto require = [&](bool ok, const char* what) {
    if (!ok) {
      LATTICE_THROW(ConfigError,
                    "calibration of '{}': {} ---> HINT: the measurement failed or was skipped; "
                    "rerun `lattice bench calibrate`",
                    machine.name, what);
    }
  };
  require(machine.ranks_per_node > 0, "ranks_per_node must be positive");
  require(machine.memory_bytes > 0, "physical memory not measured");
  require(machine.memory_bytes_per_s > 0, "memory bandwidth not measured");
  require(!machine.gemm.empty(), "no GEMM measured");

  ClusterSpec c;
  c.name = machine.name;
  c.gpus_per_node = machine.ranks_per_node;
  c.device.name = machine.device_name;
  c.device.memory_bytes = machine.memory_bytes;
  c.device.reserved_bytes = 0;
  c.device.hbm_bytes_per_s = machine.memory_bytes_per_s;
  for (const GemmMeasurement& g : machine.gemm) {
    require(g.flops_per_s > 0 && g.m > 0 && g.n > 0 && g.k > 0, "a GEMM with a zero figure");
    double& peak =
        g.precision == Precision::kBf16 ? c.device.peak_flops_bf16 : c.device.peak_flops_fp32;
    peak = std::max(peak, g.flops_per_s);
  }
  c.device.max_gemm_efficiency = 1.0;  // efficiencies are relative to the measured ceiling
  for (const GemmMeasurement& g : machine.gemm) {
    c.gemm.push_back({.precision = g.precision,
                      .m = g.m,
                      .n = g.n,
                      .k = g.k,
                      .efficiency = g.flops_per_s / c.peak_flops(g.precision)});
  }

  // The link: the all-reduce of the largest group measured, else an in-memory copy.
  c.intra_node = {.name = "in-process threads",
                  .peak_bytes_per_s = machine.memory_bytes_per_s / 2,
                  .achievable = 1.0,
                  .alpha_s = 0};
  int64_t largest = 0;
  for (const CollectiveMeasurement& m : machine.collectives) {
    require(m.group_size > 1 && m.bus_bytes_per_s > 0 && m.alpha_s >= 0,
            "a collective with group size < 2 or a non-positive bandwidth");
    c.collectives.push_back({.transport = Transport::kIntraNode,
                             .op = m.op,
                             .group_size = m.group_size,
                             .alpha_s = m.alpha_s,
                             .bus_bytes_per_s = m.bus_bytes_per_s});
    if (m.op == CollectiveOp::kAllReduce && m.group_size > largest) {
      largest = m.group_size;
      c.intra_node.peak_bytes_per_s = m.bus_bytes_per_s;
      c.intra_node.alpha_s = m.alpha_s / ring_steps(m.group_size);
    }
  }
  c.inter_node = c.intra_node;
  c.inter_node.name = "none: one machine (copy of the intra-node link)";
  return c;
}

}  // namespace lattice::plan
