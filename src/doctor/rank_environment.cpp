#include "doctor/rank_environment.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "core/thread_budget.h"
#include "doctor/machine.h"

namespace lattice::doctor {

namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// Lines of `nvidia-smi -L`, or -1 where it is not installed or fails.
int nvidia_smi_gpus() {
  if (std::system("command -v nvidia-smi > /dev/null 2>&1") != 0) return -1;
  FILE* pipe = ::popen("nvidia-smi -L 2>/dev/null", "r");
  if (pipe == nullptr) return -1;
  int lines = 0;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr)
    if (std::string(buffer).starts_with("GPU ")) ++lines;
  return ::pclose(pipe) == 0 ? lines : -1;
}

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::nullopt : std::optional<std::string>(value);
}

// "0-3,8" for a sorted list of cores.
std::string cpu_list(const std::vector<int>& cpus) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    runs.push_back(i == j ? std::to_string(cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(runs, ","));
}

std::map<std::string, std::vector<const RankEnvironment*>> by_host(
    const std::vector<RankEnvironment>& ranks) {
  std::map<std::string, std::vector<const RankEnvironment*>> hosts;
  for (const RankEnvironment& r : ranks) hosts[r.host].push_back(&r);
  return hosts;
}

CheckResult check_launcher(const std::vector<RankEnvironment>& ranks) {
  CheckResult r;
  r.id = "launcher";
  r.title = "Launcher's ranks vs Lattice's";
  if (std::none_of(ranks.begin(), ranks.end(), [](const auto& e) { return bool(e.launcher); })) {
    r.verdict = Verdict::kNotApplicable;
    r.saw =
        "no launcher variables (OMPI_COMM_WORLD_*, PMI_*, SLURM_*, lattice launch's LATTICE_RANK): "
        "started by hand";
    return r;
  }
  for (const RankEnvironment& e : ranks) {
    if (!e.launcher || e.launcher->rank != e.rank || e.launcher->size != e.world) {
      r.verdict = Verdict::kFail;
      r.saw = e.launcher
                  ? fmt::format("rank {} of {} is rank {} of {} to its launcher ({})", e.rank,
                                e.world, e.launcher->rank, e.launcher->size, e.launcher->launcher)
                  : fmt::format("rank {} of {} has no launcher variables", e.rank, e.world);
      r.fix =
          "start every rank with the same launcher and -np as the world (mpirun -np N, srun "
          "-n N); do not mix launchers";
      return r;
    }
  }
  for (const auto& [host, on_host] : by_host(ranks)) {
    std::vector<int> locals;
    for (const RankEnvironment* e : on_host) locals.push_back(e->launcher->local_rank);
    std::sort(locals.begin(), locals.end());
    for (int i = 0; i < int(locals.size()); ++i) {
      if (locals[size_t(i)] == i) continue;
      r.verdict = Verdict::kFail;
      r.saw = fmt::format("the {} ranks on {} have local ranks {}, not 0 .. {}", on_host.size(),
                          host, fmt::join(locals, ", "), on_host.size() - 1);
      r.fix =
          "the launcher's local rank picks a rank's cores and devices: give each node's "
          "ranks distinct local ranks (mpirun --map-by node or slot, srun --ntasks-per-node)";
      return r;
    }
  }
  r.verdict = Verdict::kPass;
  r.saw = fmt::format("{} ranks on {} host(s): every launcher's rank, size and local rank agree",
                      ranks.size(), by_host(ranks).size());
  return r;
}

CheckResult check_affinity(const std::vector<RankEnvironment>& ranks) {
  CheckResult r;
  r.id = "affinity";
  r.title = "Rank ↔ core alignment";
  std::vector<std::string> placements;
  for (const auto& [host, on_host] : by_host(ranks)) {
    for (size_t a = 0; a < on_host.size(); ++a) {
      const RankEnvironment& x = *on_host[a];
      placements.push_back(fmt::format("rank {}: cores {}", x.rank, cpu_list(x.cpus)));
      for (size_t b = a + 1; b < on_host.size(); ++b) {
        const RankEnvironment& y = *on_host[b];
        std::vector<int> shared;
        std::set_intersection(x.cpus.begin(), x.cpus.end(), y.cpus.begin(), y.cpus.end(),
                              std::back_inserter(shared));
        if (shared.empty()) continue;
        r.verdict = Verdict::kFail;
        r.saw = fmt::format(
            "ranks {} and {} on {} share cores {} (rank {}: {}, rank {}: {}): their threads "
            "compete and every step waits for the slower",
            x.rank, y.rank, host, cpu_list(shared), x.rank, cpu_list(x.cpus), y.rank,
            cpu_list(y.cpus));
        r.fix =
            "bind each rank to its own cores: mpirun --bind-to core --map-by slot:PE=T (T "
            "threads per rank), srun --cpu-bind=cores, lattice launch --cores-per-rank T";
        return r;
      }
    }
  }
  for (const RankEnvironment& e : ranks) {
    if (int(e.cpus.size()) < e.threads) {
      r.verdict = Verdict::kWarn;
      r.saw = fmt::format("rank {} may use {} core(s) ({}) for a budget of {} threads", e.rank,
                          e.cpus.size(), cpu_list(e.cpus), e.threads);
      r.fix = fmt::format(
          "give each rank {} cores (mpirun --map-by slot:PE={}) or lower "
          "train.threads",
          e.threads, e.threads);
      return r;
    }
    if (e.numa_nodes_spanned > 1) {
      r.verdict = Verdict::kWarn;
      r.saw = fmt::format("rank {}'s cores {} span {} NUMA nodes", e.rank, cpu_list(e.cpus),
                          e.numa_nodes_spanned);
      r.fix = "keep each rank on one node: mpirun --bind-to core --map-by numa";
      return r;
    }
  }
  r.verdict = Verdict::kPass;
  r.saw = fmt::format("disjoint cores, each holding its thread budget on one NUMA node: {}",
                      fmt::join(placements, "; "));
  return r;
}

CheckResult check_devices(const std::vector<RankEnvironment>& ranks) {
  CheckResult r;
  r.id = "devices";
  r.title = "Devices given to each rank";
  const bool any_cuda = std::any_of(ranks.begin(), ranks.end(),
                                    [](const auto& e) { return bool(e.cuda_visible_devices); });
  const bool any_gpus =
      std::any_of(ranks.begin(), ranks.end(), [](const auto& e) { return e.visible_gpus > 0; });
  if (!any_cuda && !any_gpus) {
    r.verdict = Verdict::kNotApplicable;
    r.saw = "no CUDA_VISIBLE_DEVICES and no nvidia-smi: Lattice runs on the CPU cores";
    return r;
  }
  for (const auto& [host, on_host] : by_host(ranks)) {
    std::map<std::string, int> seen;
    for (const RankEnvironment* e : on_host) {
      if (!e->cuda_visible_devices) continue;
      const auto [it, fresh] = seen.emplace(*e->cuda_visible_devices, e->rank);
      if (fresh) continue;
      r.verdict = Verdict::kFail;
      r.saw = fmt::format("ranks {} and {} on {} are both given CUDA_VISIBLE_DEVICES={}",
                          it->second, e->rank, host, *e->cuda_visible_devices);
      r.fix =
          "give each local rank its own device (CUDA_VISIBLE_DEVICES=$LOCAL_RANK, srun "
          "--gpus-per-task=1)";
      return r;
    }
  }
  r.verdict = Verdict::kPass;
  r.saw = "each rank of a host is given its own devices";
  return r;
}

}  // namespace

RankEnvironment observe_rank_environment(int rank, int world, int threads) {
  RankEnvironment e;
  e.rank = rank;
  e.world = world;
  e.host = host_name();
  e.launcher = detect_launch_environment();
  // Under `lattice launch` the agent's view: the rank it assigned this process (LATTICE_RANK;
  // a spare, without one, has no view yet).
  if (!e.launcher && std::getenv("LATTICE_RANK") != nullptr) {
    if (const auto gloo = detect_gloo_environment()) {
      e.launcher = LaunchEnvironment{.launcher = "lattice launch",
                                     .rank = gloo->rank,
                                     .size = gloo->size,
                                     .local_rank = gloo->local_rank};
    }
  }
  e.cpus = affinity_cpus();
  const MachineFacts machine = observe_machine();
  e.numa_nodes_spanned = machine.numa_nodes_spanned;
  e.threads = threads > 0 ? threads : std::max(1, int(e.cpus.size()));
  e.omp_num_threads = env("OMP_NUM_THREADS");
  e.cuda_visible_devices = env("CUDA_VISIBLE_DEVICES");
  e.visible_gpus = nvidia_smi_gpus();
  return e;
}

nlohmann::json to_json(const RankEnvironment& e) {
  nlohmann::json j = {{"rank", e.rank},
                      {"world", e.world},
                      {"host", e.host},
                      {"cpus", e.cpus},
                      {"numa_nodes_spanned", e.numa_nodes_spanned},
                      {"threads", e.threads},
                      {"visible_gpus", e.visible_gpus}};
  if (e.launcher) {
    j["launcher"] = {{"name", e.launcher->launcher},
                     {"rank", e.launcher->rank},
                     {"size", e.launcher->size},
                     {"local_rank", e.launcher->local_rank}};
  }
  if (e.omp_num_threads) j["omp_num_threads"] = *e.omp_num_threads;
  if (e.cuda_visible_devices) j["cuda_visible_devices"] = *e.cuda_visible_devices;
  return j;
}

RankEnvironment rank_environment_from_json(const nlohmann::json& j) {
  RankEnvironment e;
  e.rank = j.at("rank").get<int>();
  e.world = j.at("world").get<int>();
  e.host = j.at("host").get<std::string>();
  e.cpus = j.at("cpus").get<std::vector<int>>();
  e.numa_nodes_spanned = j.at("numa_nodes_spanned").get<int>();
  e.threads = j.at("threads").get<int>();
  e.visible_gpus = j.at("visible_gpus").get<int>();
  if (j.contains("launcher")) {
    const nlohmann::json& l = j.at("launcher");
    e.launcher = LaunchEnvironment{.launcher = l.at("name").get<std::string>(),
                                   .rank = l.at("rank").get<int>(),
                                   .size = l.at("size").get<int>(),
                                   .local_rank = l.at("local_rank").get<int>()};
  }
  if (j.contains("omp_num_threads")) e.omp_num_threads = j.at("omp_num_threads");
  if (j.contains("cuda_visible_devices")) e.cuda_visible_devices = j.at("cuda_visible_devices");
  return e;
}

std::vector<CheckResult> check_rank_environments(const std::vector<RankEnvironment>& ranks) {
  return {check_launcher(ranks), check_affinity(ranks), check_devices(ranks)};
}

}  // namespace lattice::doctor
