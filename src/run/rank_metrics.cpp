#include "run/rank_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/timer.h"

namespace lattice {

namespace {

nlohmann::json by_category(const std::array<size_t, kMemoryCategoryCount>& bytes) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t c = 0; c < kMemoryCategoryCount; ++c) {
    j[std::string(memory_category_name(MemoryCategory(c)))] = bytes[c];
  }
  return j;
}

}  // namespace

std::filesystem::path rank_metrics_path(const std::filesystem::path& run_dir, int rank) {
  return run_dir / "metrics" / fmt::format("rank_{:05d}.jsonl", rank);
}

void write_run_info(const std::filesystem::path& run_dir, const nlohmann::json& info) {
  std::filesystem::create_directories(run_dir / "metrics");
  write_file_atomically(run_dir / "metrics" / "run.json", info.dump(2) + "\n");
}

nlohmann::json read_run_info(const std::filesystem::path& run_dir) {
  std::ifstream in(run_dir / "metrics" / "run.json");
  const nlohmann::json info = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return info.is_object() ? info : nlohmann::json::object();
}

RunMetrics read_run_metrics(const std::filesystem::path& run_dir) {
  const std::filesystem::path dir = run_dir / "metrics";
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("rank_") && name.ends_with(".jsonl")) files.push_back(entry.path());
  }
  if (files.empty()) {
    LATTICE_THROW(IoError,
                  "{} holds no per-rank metrics (metrics/rank_NNNNN.jsonl) ---> HINT: pass the "
                  "output.dir of a lattice train run",
                  run_dir.string());
  }
  std::sort(files.begin(), files.end());
  RunMetrics run;
  for (const std::filesystem::path& file : files) {
    std::vector<nlohmann::json>& records = run.records.emplace_back();
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step")) records.push_back(std::move(j));
    }
  }
  run.info = read_run_info(run_dir);
  return run;
}

RankMetrics::RankMetrics(const std::filesystem::path& run_dir, DeviceMesh& mesh, const Arena& arena,
                         int64_t continue_after, CostProfile profile)
    : log_(rank_metrics_path(run_dir, mesh.world().rank()), continue_after),
      rank_(mesh.world().rank()),
      at_(mesh.coordinates()),
      arena_(arena),
      profile_(std::move(profile)) {
  const Communicator* groups[] = {
      &mesh.replicas(), &mesh.tp(), &mesh.pp(),
      mesh.cp(),        mesh.ep(),  mesh.ep() != nullptr ? &mesh.expert_replicas() : nullptr};
  for (const Communicator* group : groups) {
    if (group != nullptr && group->size() > 1) groups_.push_back({group, group->stats()});
  }
}

void RankMetrics::write(const StepMetrics& m, double peak_flops) {
  const Stopwatch watch;
  nlohmann::json comm = nlohmann::json::array();
  for (Group& g : groups_) {
    const CommStats now = g.comm->stats();
    for (int c = 0; c < kCollectiveCount; ++c) {
      for (int a = 0; a < kAlgorithmCount; ++a) {
        const CollectiveTotals& total = now.totals(Collective(c), Algorithm(a));
        const CollectiveTotals& earlier = g.before.totals(Collective(c), Algorithm(a));
        const uint64_t calls = total.calls - earlier.calls;
        if (calls == 0) continue;
        const uint64_t bytes = total.bytes - earlier.bytes;
        const double seconds = total.seconds - earlier.seconds;
        const double algbw = seconds > 0 ? double(bytes) / seconds : 0.0;
        nlohmann::json entry = {
            {"group", g.comm->name()},
            {"size", g.comm->size()},
            {"collective", collective_name(Collective(c))},
            {"algorithm", algorithm_name(Algorithm(a))},
            {"calls", calls},
            {"bytes", bytes},
            {"seconds", seconds},
            {"algbw", algbw},
            {"busbw", algbw * bus_bandwidth_factor(Collective(c), g.comm->size())}};
        if (const auto model = profile_.find(Collective(c), Algorithm(a), g.comm->size())) {
          // The profile's time for calls of this size over the measured: 1 at the calibrated speed.
          const double predicted = double(calls) * model->predict(double(bytes) / double(calls));
          if (seconds > 0) entry["profile_share"] = predicted / seconds;
        }
        comm.push_back(std::move(entry));
      }
    }
    g.before = now;
  }
  const MemoryStats memory = arena_.stats();
  nlohmann::json record = {{"step", m.step},
                           {"rank", rank_},
                           {"at", {{"pp", at_.pp}, {"dp", at_.dp}, {"tp", at_.tp}, {"cp", at_.cp}}},
                           {"loss", m.loss},
                           {"lr", m.lr},
                           {"grad_norm", m.grad_norm},
                           {"ms", m.ms},
                           {"tokens_per_s", m.tokens_per_s},
                           {"mfu", m.model_flops_per_s / peak_flops},
                           {"parts",
                            {{"busy_ms", m.busy_ms()},
                             {"forward_ms", m.forward_ms},
                             {"backward_ms", m.backward_ms},
                             {"pipeline_compute_ms", m.pipeline_compute_ms},
                             {"optimizer_ms", m.optimizer_ms},
                             {"exposed_comm_ms", m.exposed_comm_ms},
                             {"pipeline_idle_ms", m.pipeline_idle_ms}}},
                           {"memory",
                            {{"live_bytes", memory.live_bytes},
                             {"peak_bytes", memory.peak_bytes},
                             {"reserved_bytes", memory.reserved_bytes},
                             {"fragmentation", memory.fragmentation()},
                             {"live", by_category(memory.live_by_category)},
                             {"peak", by_category(memory.peak_by_category)}}},
                           {"comm", std::move(comm)}};
  if (m.val_loss) record["val_loss"] = *m.val_loss;
  if (!m.expert_layers.empty()) {
    // Per sparse layer this rank holds: the tokens each expert received this step (doctor
    // --run's routing check reads them).
    const size_t E = m.expert_tokens.size() / m.expert_layers.size();
    nlohmann::json layers = nlohmann::json::array();
    for (size_t i = 0; i < m.expert_layers.size(); ++i) {
      const auto first = m.expert_tokens.begin() + std::ptrdiff_t(i * E);
      const auto dropped = m.expert_dropped.begin() + std::ptrdiff_t(i * E);
      layers.push_back({{"layer", m.expert_layers[i]},
                        {"tokens", std::vector<int64_t>(first, first + std::ptrdiff_t(E))},
                        {"dropped", std::vector<int64_t>(dropped, dropped + std::ptrdiff_t(E))}});
    }
    record["router_loss"] = m.router_loss;
    record["experts"] = std::move(layers);
  }
  log_.write(record);
  write_seconds_ += watch.seconds();
  step_seconds_ += m.ms / 1e3;
}

}  // namespace lattice
