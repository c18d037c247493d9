// What the doctor reads of the machine this process runs on: the cores it may use, the NUMA
// nodes (hwloc), the memory still available, and thread settings that fight Lattice's budget.
// A plain struct, so that tests describe a machine instead of needing one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "core/core_latency.h"

namespace lattice::doctor {

struct MachineFacts {
  int cores = 1;                               // in this process's CPU affinity (sched_getaffinity)
  int numa_nodes = 1;                          // on the machine
  int numa_nodes_spanned = 1;                  // that the affinity's cores belong to
  int64_t available_memory_bytes = -1;         // /proc/meminfo MemAvailable; -1 unknown
  std::optional<std::string> omp_num_threads;  // OMP_NUM_THREADS as set, if it is
  // A cache line's round trip between the affinity's first two CPUs (core/core_latency.h); ns 0:
  // not measured (one CPU). A host may place a VM's CPUs on different dies.
  CpuDistance cpu_distance;
  // The kernel's transparent huge pages mode ("always", "madvise" or "never"); "" where the
  // kernel has none. The arena asks for huge pages with madvise (core/arena.h).
  std::string transparent_huge_pages;
};

MachineFacts observe_machine();

// The mode a /sys/kernel/mm/transparent_hugepage/enabled line selects: the bracketed word of
// "always [madvise] never"; "" when none is bracketed.
std::string selected_sysfs_choice(const std::string& line);

// port_xmit_wait of every RDMA port under `root` (<root>/<device>/ports/<port>/counters/
// port_xmit_wait: time the port had data to send but no credit, the sign of PFC back-pressure),
// keyed "device/port"; empty where the machine has none.
std::map<std::string, int64_t> read_port_xmit_wait(
    const std::filesystem::path& root = "/sys/class/infiniband");

// Flow-control pause counters of an `ethtool -S IFACE` listing ("  rx_pause_ctrl_phy: 12"):
// every counter whose name holds "pause" (802.3x and per-priority PFC frames), without the
// duration and transition counters beside them; keyed by counter name.
std::map<std::string, int64_t> parse_pause_counters(const std::string& ethtool_statistics);

// Those counters of every physical network interface under `net` (one with a device/ link),
// keyed "iface/counter", read by running `ethtool -S IFACE`; empty where `ethtool` is not
// there (scripts/setup.sh installs it) or a driver reports none.
std::map<std::string, int64_t> read_pause_frames(
    const std::filesystem::path& ethtool = "/usr/sbin/ethtool",
    const std::filesystem::path& net = "/sys/class/net");

// after − before per key (a key new in `after` counts from 0).
std::map<std::string, int64_t> counter_deltas(const std::map<std::string, int64_t>& before,
                                              const std::map<std::string, int64_t>& after);

}  // namespace lattice::doctor
