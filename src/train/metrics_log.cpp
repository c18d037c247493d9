#include "train/metrics_log.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lattice {

std::string format_progress(const StepMetrics& m, int64_t total_steps, double peak_flops) {
  int width = int(fmt::format("{}", total_steps).size());
  std::string line = fmt::format(
      "step {:>{}}/{} | loss {:.4f} | lr {:.2e} | grad-norm {:.3f} | {:.0f} tok/s | {:.1f} ms | "
      "MFU {:.1f}%",
      m.step, width, total_steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.ms,
      100.0 * m.model_flops_per_s / peak_flops);
  if (!m.expert_layers.empty()) {
    line += fmt::format(" | router {:.4f} | experts max/mean {:.2f}", m.router_loss,
                        m.expert_imbalance);
  }
  if (m.val_loss) line += fmt::format(" | val {:.4f}", *m.val_loss);
  if (m.bubble_fraction) line += fmt::format(" | bubble {:.1f}%", 100.0 * *m.bubble_fraction);
  return line;
}

MetricsLog::MetricsLog(const std::filesystem::path& path, int64_t continue_after) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::string kept;
  if (continue_after > 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].get<int64_t>() <= continue_after) {
        kept += line + "\n";
      }
    }
  }
  out_.open(path, std::ios::out | std::ios::trunc);
  out_ << kept;
  if (!out_) LATTICE_THROW(IoError, "cannot write metrics file '{}'", path.string());
}

void MetricsLog::write(const StepMetrics& m, double peak_flops) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"tokens_per_s", m.tokens_per_s},
                      {"ms", m.ms},
                      {"mfu", m.model_flops_per_s / peak_flops}};
  if (m.loop_ms > 0) j["loop_ms"] = m.loop_ms;
  if (m.snapshot_ms > 0) j["snapshot_ms"] = m.snapshot_ms;
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  if (m.bubble_fraction) j["bubble_fraction"] = *m.bubble_fraction;
  if (!m.expert_layers.empty()) {
    j["router_loss"] = m.router_loss;
    j["expert_imbalance"] = m.expert_imbalance;
  }
  write(j);
}

void MetricsLog::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace lattice
