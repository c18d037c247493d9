// The alpha-beta cost model (Hockney 1994; Thakur et al. 2005): one call of a collective with a
// given algorithm and group size costs alpha + beta * bytes seconds. alpha gathers the per-step
// latencies, beta the inverse bandwidth times the bytes each rank moves per byte of message.
//
// A CostProfile holds models measured on the running machine (`lattice bench comm --calibrate`
// writes one); without a measurement the analytic default below is used.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/comm_types.h"

namespace lattice {

struct CostModel {
  double alpha = 0;  // seconds
  double beta = 0;   // seconds per byte of message
  // Measured (bytes, seconds) points, ascending in bytes. When present, predict() interpolates
  // linearly between neighbouring points (a local alpha-beta per size range: caches make one
  // line over 4 KiB..256 MiB a poor fit) and uses alpha + beta * bytes outside them.
  std::vector<std::pair<double, double>> samples;
  double predict(double bytes) const;
};

// The textbook step and volume counts of each algorithm priced with per-step latency
// `step_seconds` and per-byte time `byte_seconds`.
CostModel default_cost_model(Collective collective, Algorithm algorithm, int group_size,
                             double step_seconds = 10e-6, double byte_seconds = 1.0 / 4e9);

// Least-squares fit of seconds = alpha + beta * bytes (alpha, beta clamped at >= 0).
CostModel fit_cost_model(const std::vector<std::pair<double, double>>& bytes_seconds);

class CostProfile {
 public:
  void set(Collective collective, Algorithm algorithm, int group_size, CostModel model);
  std::optional<CostModel> find(Collective collective, Algorithm algorithm, int group_size) const;
  bool empty() const { return models_.empty(); }

  // JSON: {"transport": "...", "models": [{"collective", "algorithm", "group_size", "alpha",
  // "beta"}, ...]}. load() throws IoError / ConfigError naming the file, and ConfigError when
  // `expected` is given and the profile was measured on another transport.
  void save(const std::string& path, TransportKind transport) const;
  static CostProfile load(const std::string& path,
                          std::optional<TransportKind> expected = std::nullopt);

 private:
  std::map<std::tuple<Collective, Algorithm, int>, CostModel> models_;
};

}  // namespace lattice
