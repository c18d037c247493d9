// From measurements of one machine to the ClusterSpec a cluster profile stores: what
// `lattice bench calibrate` measures (cli/bench_command.cpp runs the kernels and collectives)
// becomes peaks, GEMM efficiencies and collective α / bus bandwidths here, without running
// anything (plan/ is a pure function of its inputs).
//
// A CPU has no published "peak" the planner could trust, so the peak of a precision is the best
// GEMM throughput measured for it (the practical ceiling); every GEMM efficiency is relative to
// it, and max_gemm_efficiency is 1. The machine is one node: the inter-node link is a copy of
// the intra-node one (the in-process thread transport), named so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/cluster_spec.h"
#include "plan/collective_cost.h"  // bus_factor: bus bandwidth = bus_factor / beta

namespace lattice::plan {

struct GemmMeasurement {
  Precision precision = Precision::kBf16;
  int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;
};

// A fitted t(S) = alpha_s + S · factor(op, n) / bus_bytes_per_s (CollectivePoint's model).
struct CollectiveMeasurement {
  CollectiveOp op = CollectiveOp::kAllReduce;
  int64_t group_size = 0;
  double alpha_s = 0;
  double bus_bytes_per_s = 0;
};

struct MachineMeasurement {
  std::string name = "cpu";
  std::string device_name = "cpu";
  int64_t ranks_per_node = 1;     // cores ÷ threads per rank
  double memory_bytes = 0;        // physical memory
  double memory_bytes_per_s = 0;  // memcpy traffic (bytes read + written per second)
  std::vector<GemmMeasurement> gemm;
  std::vector<CollectiveMeasurement> collectives;  // the in-process transport (intra_node)
};

// Throws ConfigError naming what is missing (no GEMM measured, a non-positive figure).
ClusterSpec calibrated_cluster(const MachineMeasurement& machine);

}  // namespace lattice::plan
