// What the planner knows about the hardware: one accelerator kind, nodes of gpus_per_node of
// them, a link inside a node and a link between nodes, and what calibration measured.
//
// Presets (cluster_presets.cpp) carry published peaks times a default achievable fraction;
// a profile written by `lattice bench calibrate` (cluster_profile.h) replaces them with
// measurements: GEMM efficiency by shape and precision, collective α and bus bandwidth per
// transport, operation and group size.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lattice::plan {

// How training stores its numbers (mixed precision: bf16 compute, fp32 master weights).
enum class Precision { kBf16, kFp32 };
// Which link a collective's slowest hop crosses (DESIGN.md: mesh order tp, dp, pp).
enum class Transport { kIntraNode, kInterNode };
// kAllToAll: each rank's buffer split into n blocks, block j to rank j (pairwise: n − 1 steps).
enum class CollectiveOp { kAllReduce, kAllGather, kReduceScatter, kSendRecv, kAllToAll };

struct DeviceSpec {
  std::string name;
  double memory_bytes = 0;    // what the device reports
  double reserved_bytes = 0;  // runtime context and library workspaces, never available
  double hbm_bytes_per_s = 0;
  double peak_flops_bf16 = 0;  // dense
  double peak_flops_fp32 = 0;
  // Uncalibrated GEMM efficiency: max_gemm_efficiency · Π_{d∈m,n,k} d / (d + gemm_half_dim).
  double max_gemm_efficiency = 0.75;
  double gemm_half_dim = 64;
};

struct LinkSpec {
  std::string name;
  double peak_bytes_per_s = 0;  // per device, one direction
  double achievable = 0.8;      // bus bandwidth nccl-tests reaches ÷ peak
  double alpha_s = 0;           // latency of one ring step
  // Message size at which a collective's bus bandwidth reaches half its plateau (0: the plateau
  // at every size). NCCL pipelines a buffer in chunks over its channels, so mid-sized buffers —
  // a tensor-parallel all-reduce of b·s·h is tens of MB — run below nccl-tests' large-message
  // figure: bus bandwidth(S) = plateau · S / (S + half_bandwidth_bytes).
  double half_bandwidth_bytes = 0;
};

// One measured GEMM: efficiency = achieved FLOP/s ÷ peak of its precision.
struct GemmPoint {
  Precision precision = Precision::kBf16;
  int64_t m = 0, n = 0, k = 0;
  double efficiency = 0;
};

// One measured collective: t(S) = alpha_s + S · factor(op, n) / bus_bytes_per_s, S the whole
// buffer in bytes and factor the nccl-tests bus factor (2(n−1)/n all-reduce, (n−1)/n gather and
// scatter, 1 send/recv). alpha_s is the whole call's latency at this group size.
struct CollectivePoint {
  Transport transport = Transport::kIntraNode;
  CollectiveOp op = CollectiveOp::kAllReduce;
  int64_t group_size = 0;
  double alpha_s = 0;
  double bus_bytes_per_s = 0;
};

// What the software achieves beyond raw speeds. One curve cannot fit two codebases (Megatron-LM
// of 2021 all-reduced gradients after the backward; Megatron-Core overlaps them per bucket), so a
// profile names the software it describes and the report says which.
struct RuntimeFactors {
  std::string software;         // e.g. "megatron-lm 2022"; empty: not named
  double dp_overlap = 0.8;      // share of the backward that gradient reduction can hide behind
  double fragmentation = 0.10;  // allowance on dynamically allocated bytes (activations, buffers)
  double dp_bucket_bytes = 25.0 * (1 << 20);  // gradient bucket (PyTorch DDP's 25 MiB default)
  // Seconds per layer and micro-batch forward (backward twice) that no GEMM or memory sweep
  // accounts for: kernel launches and the gaps between a layer's dependent kernels.
  double layer_overhead_s = 0;
  // Multiplies every GEMM's efficiency: what a codebase reaches of the device curve.
  double compute_efficiency = 1.0;
  // Where compute_efficiency was measured (a published run's id, say); empty: given as is.
  std::string compute_efficiency_from;
  // ZeRO-2 as PyTorch FSDP's SHARD_GRAD_OP runs it: the parameters are gathered before each
  // micro-batch's forward, kept through its backward and resharded after it, so every
  // micro-batch pays an all-gather besides its reduce-scatter (false: DeepSpeed's ZeRO-2, which
  // keeps the parameters whole and gathers the updated shards once a step).
  bool zero2_regathers_per_micro_batch = false;
};

// Power and prices, for lattice plan's energy and cost. A device draws busy_watts while it
// computes and waiting_watts while it waits (exposed communication, the pipeline bubble); the
// rest of a node (CPUs, memory, NICs, fans) draws node_other_watts; the facility multiplies
// the lot by its power usage effectiveness.
struct PowerSpec {
  double busy_watts = 0;
  double waiting_watts = 0;
  double node_other_watts = 0;
  double pue = 1.0;
};

// What an hour of one device and a kWh cost (0: not known, and the report leaves money out).
// A rented device's price includes its power: give per_kwh only for power paid apart.
struct PriceSpec {
  double per_device_hour = 0;
  double per_kwh = 0;
};

struct ClusterSpec {
  std::string name;
  int64_t gpus_per_node = 8;
  DeviceSpec device;
  LinkSpec intra_node;
  LinkSpec inter_node;
  std::vector<GemmPoint> gemm;               // empty: the uncalibrated curve
  std::vector<CollectivePoint> collectives;  // empty: the link presets
  RuntimeFactors runtime;
  PowerSpec power;
  PriceSpec price;

  double usable_memory_bytes() const { return device.memory_bytes - device.reserved_bytes; }
  double peak_flops(Precision precision) const {
    return precision == Precision::kBf16 ? device.peak_flops_bf16 : device.peak_flops_fp32;
  }
  const LinkSpec& link(Transport t) const {
    return t == Transport::kIntraNode ? intra_node : inter_node;
  }
};

// Efficiency of an (m×k)·(k×n) GEMM in [0, 1]. With measurements: the nearest measured shape
// (log distance) of that precision, scaled by the uncalibrated curve's ratio between the two
// shapes; without: the curve.
double gemm_efficiency(const ClusterSpec& cluster, Precision precision, double m, double n,
                       double k);

// Throws ConfigError naming the presets when `name` is unknown.
ClusterSpec cluster_preset(std::string_view name);
std::vector<std::string> cluster_preset_names();
// A preset name, or else a path to a profile JSON.
ClusterSpec resolve_cluster(const std::string& name_or_path);

std::string_view precision_name(Precision p);
std::string_view transport_name(Transport t);
std::string_view collective_name(CollectiveOp op);
Precision parse_precision(std::string_view name);

}  // namespace lattice::plan
