#include "comm/cost_model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>

#include "core/error.h"
#include "core/json_field.h"

namespace lattice {
namespace {

struct Counts {
  double steps = 0;   // sequential message latencies
  double volume = 0;  // bytes moved by the busiest rank per byte of message
};

Counts algorithm_counts(Collective c, Algorithm a, int group_size) {
  const double n = group_size;
  if (group_size <= 1) return {};
  const double p = double(std::bit_floor(unsigned(group_size)));
  const bool fixup = p != n;
  const double lg = std::log2(p) + (fixup ? 2 : 0);  // halving/doubling steps
  const double depth = std::ceil(std::log2(n));      // binomial tree depth
  const double share = (n - 1) / n;                  // bandwidth-optimal volume per phase
  switch (c) {
    case Collective::kAllReduce:
      if (a == Algorithm::kRing) return {2 * (n - 1), 2 * share};
      if (a == Algorithm::kTree) return {2 * depth, 2 * depth};
      return {2 * lg, 2 * share + (fixup ? 2 : 0)};
    case Collective::kReduceScatter:
    case Collective::kAllGather:
      if (a == Algorithm::kRing) return {n - 1, share};
      if (a == Algorithm::kTree) return {2 * depth, depth + 1};
      return {lg, share + (fixup ? 1 : 0)};
    case Collective::kBroadcast:
      if (a == Algorithm::kRing) return {n - 1, 1};
      if (a == Algorithm::kTree) return {depth, depth};
      return {depth + lg, 2};
    case Collective::kReduce:
      if (a == Algorithm::kTree) return {depth, depth};
      return {lg + depth, share + 1};
    case Collective::kAllToAll:  // pairwise: n - 1 steps, all but the own block leaves
      return {n - 1, share};
    default:
      return {depth, 0};
  }
}

}  // namespace

double CostModel::predict(double bytes) const {
  if (samples.size() >= 2 && bytes >= samples.front().first && bytes <= samples.back().first) {
    auto hi = std::lower_bound(samples.begin(), samples.end(), bytes,
                               [](const auto& s, double b) { return s.first < b; });
    if (hi == samples.begin()) return hi->second;
    auto lo = hi - 1;
    double t = (bytes - lo->first) / (hi->first - lo->first);
    return lo->second + t * (hi->second - lo->second);
  }
  return alpha + beta * bytes;
}

CostModel default_cost_model(Collective collective, Algorithm algorithm, int group_size,
                             double step_seconds, double byte_seconds) {
  Counts k = algorithm_counts(collective, algorithm, group_size);
  if (algorithm == Algorithm::kNative)
    k = algorithm_counts(collective, Algorithm::kRing, group_size);
  return CostModel{k.steps * step_seconds, k.volume * byte_seconds, {}};
}

CostModel fit_cost_model(const std::vector<std::pair<double, double>>& bytes_seconds) {
  LATTICE_CHECK(!bytes_seconds.empty());
  // Weighted by 1 / seconds^2, i.e. least squares on relative error: the sizes span five orders
  // of magnitude, and an unweighted fit would let the largest sizes decide alpha too.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : bytes_seconds) {
    double w = y > 0 ? 1 / (y * y) : 1;
    sw += w;
    sx += w * x;
    sy += w * y;
    sxx += w * x * x;
    sxy += w * x * y;
  }
  double denom = sw * sxx - sx * sx;
  double beta = denom > 0 ? (sw * sxy - sx * sy) / denom : 0;
  beta = std::max(beta, 0.0);
  double alpha = std::max((sy - beta * sx) / sw, 0.0);
  CostModel model{alpha, beta, bytes_seconds};
  std::sort(model.samples.begin(), model.samples.end());
  return model;
}

void CostProfile::set(Collective collective, Algorithm algorithm, int group_size, CostModel model) {
  models_[{collective, algorithm, group_size}] = model;
}

std::optional<CostModel> CostProfile::find(Collective collective, Algorithm algorithm,
                                           int group_size) const {
  auto it = models_.find({collective, algorithm, group_size});
  if (it == models_.end()) return std::nullopt;
  return it->second;
}

void CostProfile::save(const std::string& path, TransportKind transport) const {
  nlohmann::json models = nlohmann::json::array();
  for (const auto& [key, m] : models_) {
    const auto& [c, a, n] = key;
    models.push_back({{"collective", collective_name(c)},
                      {"algorithm", algorithm_name(a)},
                      {"group_size", n},
                      {"alpha", m.alpha},
                      {"beta", m.beta},
                      {"samples", m.samples}});
  }
  nlohmann::json doc = {{"transport", transport_name(transport)}, {"models", models}};
  std::ofstream out(path);
  if (!out) LATTICE_THROW(IoError, "cannot write the comm profile '{}'", path);
  out << doc.dump(2) << "\n";
  if (!out) LATTICE_THROW(IoError, "failed writing the comm profile '{}'", path);
}

CostProfile CostProfile::load(const std::string& path, std::optional<TransportKind> expected) {
  std::ifstream in(path);
  if (!in) {
    LATTICE_THROW(IoError,
                  "cannot open the comm profile '{}' ---> HINT: create it with `lattice bench "
                  "comm --calibrate {}`",
                  path, path);
  }
  CostProfile profile;
  const nlohmann::json document = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) {
    LATTICE_THROW(ConfigError,
                  "the comm profile '{}' is not valid JSON ---> HINT: write it again with "
                  "`lattice bench comm --calibrate {}`",
                  path, path);
  }
  const JsonField doc(document, "comm profile '" + path + "'",
                      "write it again with `lattice bench comm --calibrate " + path + "`");
  if (expected) {
    const std::string measured = doc["transport"].string();
    if (measured != transport_name(*expected)) {
      LATTICE_THROW(ConfigError,
                    "the comm profile '{}' was measured on the {} transport, this run uses {} "
                    "---> HINT: calibrate on the run's transport (`lattice bench comm "
                    "--transport {} --calibrate {}`), or leave parallel.comm_profile unset",
                    path, measured, transport_name(*expected), transport_name(*expected), path);
    }
  }
  for (const JsonField& m : doc["models"].elements()) {
    const std::string name = m["collective"].string();
    int c = 0;
    while (c < kCollectiveCount && collective_name(Collective(c)) != name) ++c;
    if (c == kCollectiveCount) {
      LATTICE_THROW(ConfigError, "comm profile '{}': unknown collective '{}' in '{}'", path, name,
                    m.path());
    }
    CostModel model{m["alpha"].number(), m["beta"].number(), {}};
    if (const std::optional<JsonField> samples = m.find("samples")) {
      for (const JsonField& sample : samples->elements()) {
        const std::vector<JsonField> pair = sample.elements();
        if (pair.size() != 2) sample.wrong_type("a pair [bytes, seconds]");
        model.samples.emplace_back(pair[0].number(), pair[1].number());
      }
      std::sort(model.samples.begin(), model.samples.end());
    }
    Algorithm algorithm{};
    try {
      algorithm = parse_algorithm(m["algorithm"].string());
    } catch (const ValueError& e) {
      LATTICE_THROW(ConfigError, "comm profile '{}': {}", path, e.what());
    }
    profile.set(Collective(c), algorithm, int(m["group_size"].integer()), model);
  }
  return profile;
}

}  // namespace lattice
