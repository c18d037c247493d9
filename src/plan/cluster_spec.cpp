#include "plan/cluster_spec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "plan/cluster_profile.h"

namespace lattice::plan {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

// nccl-tests' all_reduce_perf on 8 NVLink-connected A100s / H100s climbs to its plateau over
// the tens of MB: about half of it near 8 MB (NVIDIA's published curves); InfiniBand's
// point-to-point and ring traffic between nodes saturates earlier, near 1 MB.
constexpr double kNvlinkHalfBandwidth = 8 * kMiB;
constexpr double kInfinibandHalfBandwidth = 1 * kMiB;
// A transformer layer's forward on a GPU is ~25 kernels (norms, GEMMs, bias and activation
// epilogues, softmax, dropout, the residual adds, the layouts' copies); each costs ~4 µs that no
// roofline sees — launch, the tail of its last wave, the gap before the next dependent one.
constexpr double kGpuLayerOverhead = 100e-6;  // 25 × 4 µs

double curve(const DeviceSpec& device, double m, double n, double k) {
  auto roll_off = [&](double d) { return d / (d + device.gemm_half_dim); };
  return device.max_gemm_efficiency * roll_off(m) * roll_off(n) * roll_off(k);
}

// Published figures: NVIDIA A100 / H100 datasheets (dense tensor-core peaks; fp32 training runs
// its matmuls on TF32 tensor cores), NVLink per-direction bandwidth, one InfiniBand NIC per GPU
// (DGX A100: HDR 200 Gb/s; DGX H100: NDR 400 Gb/s). Achievable fractions are what nccl-tests
// typically reports as bus bandwidth on these systems; calibration replaces them.
ClusterSpec dgx_a100() {
  ClusterSpec c;
  c.name = "dgx-a100";
  c.gpus_per_node = 8;
  c.device = {.name = "A100-SXM4-80GB",
              .memory_bytes = 81920 * kMiB,
              .reserved_bytes = 2 * kGiB,
              .hbm_bytes_per_s = 2.039e12,
              .peak_flops_bf16 = 312e12,
              .peak_flops_fp32 = 156e12,
              .max_gemm_efficiency = 0.80,
              .gemm_half_dim = 64};
  c.intra_node = {.name = "NVLink3",
                  .peak_bytes_per_s = 300e9,
                  .achievable = 0.78,
                  .alpha_s = 1e-6,
                  .half_bandwidth_bytes = kNvlinkHalfBandwidth};
  c.inter_node = {.name = "InfiniBand HDR",
                  .peak_bytes_per_s = 25e9,
                  .achievable = 0.90,
                  .alpha_s = 5e-6,
                  .half_bandwidth_bytes = kInfinibandHalfBandwidth};
  c.runtime.layer_overhead_s = kGpuLayerOverhead;
  // A100 SXM4 TDP 400 W (datasheet); DGX A100 maximum system power 6.5 kW (datasheet) less its
  // 8 GPUs' 3.2 kW: an upper bound for the rest of the node. Waiting at a quarter of TDP is an
  // assumption (a GPU in a communication kernel draws far below TDP, above its ~50 W idle).
  c.power = {.busy_watts = 400, .waiting_watts = 100, .node_other_watts = 3300, .pue = 1.0};
  return c;
}

ClusterSpec dgx_h100() {
  ClusterSpec c;
  c.name = "dgx-h100";
  c.gpus_per_node = 8;
  c.device = {.name = "H100-SXM5-80GB",
              .memory_bytes = 81559 * kMiB,
              .reserved_bytes = 2 * kGiB,
              .hbm_bytes_per_s = 3.35e12,
              .peak_flops_bf16 = 989e12,
              .peak_flops_fp32 = 494e12,
              .max_gemm_efficiency = 0.75,
              .gemm_half_dim = 96};
  c.intra_node = {.name = "NVLink4",
                  .peak_bytes_per_s = 450e9,
                  .achievable = 0.80,
                  .alpha_s = 1e-6,
                  .half_bandwidth_bytes = kNvlinkHalfBandwidth};
  c.inter_node = {.name = "InfiniBand NDR",
                  .peak_bytes_per_s = 50e9,
                  .achievable = 0.90,
                  .alpha_s = 4e-6,
                  .half_bandwidth_bytes = kInfinibandHalfBandwidth};
  c.runtime.layer_overhead_s = kGpuLayerOverhead;
  // H100 SXM5 TDP 700 W (datasheet); DGX H100 maximum system power 10.2 kW (datasheet) less its
  // 8 GPUs' 5.6 kW; waiting at a quarter of TDP (an assumption, as for the A100).
  c.power = {.busy_watts = 700, .waiting_watts = 175, .node_other_watts = 4600, .pue = 1.0};
  return c;
}

}  // namespace

double gemm_efficiency(const ClusterSpec& cluster, Precision precision, double m, double n,
                       double k) {
  const DeviceSpec& device = cluster.device;
  const GemmPoint* nearest = nullptr;
  double best = std::numeric_limits<double>::infinity();
  for (const GemmPoint& p : cluster.gemm) {
    if (p.precision != precision) continue;
    double distance = std::abs(std::log(m / double(p.m))) + std::abs(std::log(n / double(p.n))) +
                      std::abs(std::log(k / double(p.k)));
    if (distance < best) best = distance, nearest = &p;
  }
  if (!nearest) return curve(device, m, n, k);
  double scaled = nearest->efficiency * curve(device, m, n, k) /
                  curve(device, double(nearest->m), double(nearest->n), double(nearest->k));
  return std::min(scaled, 1.0);
}

ClusterSpec cluster_preset(std::string_view name) {
  if (name == "dgx-a100") return dgx_a100();
  if (name == "dgx-h100") return dgx_h100();
  LATTICE_THROW(ConfigError,
                "unknown cluster preset '{}' ---> HINT: use one of {} or a profile "
                "written by `lattice bench calibrate`",
                name, fmt::join(cluster_preset_names(), ", "));
}

std::vector<std::string> cluster_preset_names() {
  return {"dgx-a100", "dgx-h100"};
}

ClusterSpec resolve_cluster(const std::string& name_or_path) {
  for (const std::string& name : cluster_preset_names()) {
    if (name == name_or_path) return cluster_preset(name);
  }
  if (std::filesystem::exists(name_or_path)) return load_cluster_profile(name_or_path);
  return cluster_preset(name_or_path);  // throws, listing the presets
}

std::string_view precision_name(Precision p) {
  return p == Precision::kBf16 ? "bf16" : "fp32";
}
std::string_view transport_name(Transport t) {
  return t == Transport::kIntraNode ? "intra_node" : "inter_node";
}
std::string_view collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kSendRecv:
      return "send_recv";
    case CollectiveOp::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

Precision parse_precision(std::string_view name) {
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp32") return Precision::kFp32;
  LATTICE_THROW(ConfigError,
                "unknown precision '{}' ---> HINT: use bf16 (mixed precision) or "
                "fp32",
                name);
}

}  // namespace lattice::plan
