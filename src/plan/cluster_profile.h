// Cluster profiles: the JSON file `lattice bench calibrate` writes and `lattice plan --cluster`
// reads. Format (docs/planner.md has the full description):
//   { "format": "lattice-cluster-profile", "version": 1, "name": "...",
//     "base": "dgx-h100",                      // optional preset every other key overrides
//     "gpus_per_node": 8,
//     "device": { "name", "memory_bytes", "reserved_bytes", "hbm_bytes_per_s",
//                 "peak_flops": { "bf16", "fp32" }, "max_gemm_efficiency", "gemm_half_dim" },
//     "links": { "intra_node": { "name", "peak_bytes_per_s", "achievable", "alpha_s" },
//                "inter_node": { ... } },
//     "gemm": [ { "precision": "bf16", "m", "n", "k", "efficiency" }, ... ],
//     "collectives": [ { "transport": "intra_node", "op": "all_reduce", "group_size",
//                        "alpha_s", "bus_bytes_per_s" }, ... ],
//     "runtime": { "dp_overlap", "fragmentation", "dp_bucket_bytes" } }
#pragma once

#include <string>

#include "plan/cluster_spec.h"

namespace lattice::plan {

inline constexpr const char* kClusterProfileFormat = "lattice-cluster-profile";
inline constexpr int kClusterProfileVersion = 1;

// Throws IoError when unreadable, ConfigError naming the key when malformed or incomplete.
ClusterSpec load_cluster_profile(const std::string& path);
ClusterSpec parse_cluster_profile(const std::string& json_text, const std::string& origin);
// The profile for `cluster`, complete (no base), so that parse(write(c)) == c.
std::string write_cluster_profile(const ClusterSpec& cluster);
// Writes atomically (temporary file, then rename); throws IoError.
void save_cluster_profile(const ClusterSpec& cluster, const std::string& path);

}  // namespace lattice::plan
