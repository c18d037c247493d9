#include "doctor/machine.h"

#include <hwloc.h>
#include <sched.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/core_latency.h"
#include "core/thread_budget.h"

namespace lattice::doctor {

namespace {

// NUMA nodes of the machine, and how many of them hold a core of this process's affinity.
void observe_numa(MachineFacts& facts) {
  hwloc_topology_t topology;
  if (hwloc_topology_init(&topology) != 0) return;
  if (hwloc_topology_load(topology) != 0) {
    hwloc_topology_destroy(topology);
    return;
  }
  hwloc_bitmap_t bound = hwloc_bitmap_alloc();
  const bool have_binding = hwloc_get_cpubind(topology, bound, HWLOC_CPUBIND_PROCESS) == 0;
  const int nodes = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);
  facts.numa_nodes = std::max(1, nodes);
  if (have_binding && nodes > 0) {
    int spanned = 0;
    for (int i = 0; i < nodes; ++i) {
      hwloc_obj_t node = hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, unsigned(i));
      if (node != nullptr && hwloc_bitmap_intersects(node->cpuset, bound)) ++spanned;
    }
    facts.numa_nodes_spanned = std::max(1, spanned);
  }
  hwloc_bitmap_free(bound);
  hwloc_topology_destroy(topology);
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

}  // namespace

MachineFacts observe_machine() {
  MachineFacts facts;
  facts.cores = available_cores();
  observe_numa(facts);
  facts.available_memory_bytes = available_memory_bytes();
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) facts.omp_num_threads = omp;
  facts.cpu_distance = first_cpus_distance();
  std::ifstream huge_pages("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (std::getline(huge_pages, line)) facts.transparent_huge_pages = selected_sysfs_choice(line);
  return facts;
}

std::string selected_sysfs_choice(const std::string& line) {
  const size_t open = line.find('['), close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

std::map<std::string, int64_t> read_port_xmit_wait(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  std::map<std::string, int64_t> counters;
  std::error_code ec;
  for (const auto& device : fs::directory_iterator(root, ec)) {
    for (const auto& port : fs::directory_iterator(device.path() / "ports", ec)) {
      std::ifstream in(port.path() / "counters" / "port_xmit_wait");
      int64_t value = 0;
      if (in >> value) {
        counters[device.path().filename().string() + "/" + port.path().filename().string()] = value;
      }
    }
  }
  return counters;
}

std::map<std::string, int64_t> parse_pause_counters(const std::string& text) {
  std::map<std::string, int64_t> counters;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t begin = line.find_first_not_of(" \t");
    const std::string name = line.substr(begin, colon - begin);
    if (name.find("pause") == std::string::npos || name.find("duration") != std::string::npos ||
        name.find("transition") != std::string::npos) {
      continue;
    }
    try {
      counters[name] = std::stoll(line.substr(colon + 1));
    } catch (const std::exception&) {
      // not a number: a heading or a driver's own format
    }
  }
  return counters;
}

std::map<std::string, int64_t> read_pause_frames(const std::filesystem::path& ethtool,
                                                 const std::filesystem::path& net) {
  namespace fs = std::filesystem;
  std::map<std::string, int64_t> counters;
  std::error_code ec;
  if (!fs::exists(ethtool, ec)) return counters;
  for (const auto& entry : fs::directory_iterator(net, ec)) {
    const std::string iface = entry.path().filename().string();
    // Physical NICs only, and names that are safe on a command line.
    if (!fs::exists(entry.path() / "device", ec) ||
        !std::all_of(iface.begin(), iface.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
        })) {
      continue;
    }
    const std::string command = fmt::format("'{}' -S {} 2>/dev/null", ethtool.string(), iface);
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) continue;
    std::string text;
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) text.append(buffer, n);
    ::pclose(pipe);
    for (const auto& [name, value] : parse_pause_counters(text))
      counters[iface + "/" + name] = value;
  }
  return counters;
}

std::map<std::string, int64_t> counter_deltas(const std::map<std::string, int64_t>& before,
                                              const std::map<std::string, int64_t>& after) {
  std::map<std::string, int64_t> deltas;
  for (const auto& [key, value] : after) {
    const auto it = before.find(key);
    deltas[key] = value - (it == before.end() ? 0 : it->second);
  }
  return deltas;
}

}  // namespace lattice::doctor
