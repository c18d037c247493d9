#include "doctor/machine.h"

#include <hwloc.h>
#include <sched.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

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
  return facts;
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

}  // namespace lattice::doctor
