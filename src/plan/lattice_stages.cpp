#include "plan/lattice_stages.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "plan/pipeline_theory.h"

namespace lattice::plan {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Compute of model chunk k holding layers [a, b), from prefix sums accumulated in the runtime's
// order so that equal chunks give bitwise equal costs (the search compares them for equality).
class ChunkCompute {
 public:
  ChunkCompute(double layer, int64_t layers, double head, int64_t chunks)
      : head_(head), chunks_(chunks) {
    prefix_.push_back(0.0);
    for (int64_t l = 0; l < layers; ++l) prefix_.push_back(prefix_.back() + layer);
  }
  int64_t chunks() const { return chunks_; }
  int64_t layers() const { return int64_t(prefix_.size()) - 1; }
  double of(int64_t k, int64_t a, int64_t b) const {
    double cost = prefix_[size_t(b)] - prefix_[size_t(a)];  // the embedding costs no FLOPs
    if (k == chunks_ - 1) cost += head_;
    return cost;
  }

 private:
  std::vector<double> prefix_;  // (L + 1)
  double head_;
  int64_t chunks_;
};

// The smallest possible slowest chunk over partitions into chunks of at least one layer.
double min_max_compute(const ChunkCompute& cost) {
  const int64_t chunks = cost.chunks(), layers = cost.layers();
  std::vector<std::vector<double>> best(size_t(chunks + 1),
                                        std::vector<double>(size_t(layers + 1), kInfinity));
  best[0][0] = 0.0;
  for (int64_t k = 1; k <= chunks; ++k)
    for (int64_t i = k; i <= layers; ++i)
      for (int64_t a = k - 1; a < i; ++a) {
        if (best[size_t(k - 1)][size_t(a)] == kInfinity) continue;
        const double bottleneck = std::max(best[size_t(k - 1)][size_t(a)], cost.of(k - 1, a, i));
        best[size_t(k)][size_t(i)] = std::min(best[size_t(k)][size_t(i)], bottleneck);
      }
  return best[size_t(chunks)][size_t(layers)];
}

}  // namespace

int64_t LatticeStagePart::layers() const {
  int64_t n = 0;
  for (const LatticeChunk& c : chunks) n += c.layers();
  return n;
}

bool LatticeStagePart::has_embedding() const {
  return std::any_of(chunks.begin(), chunks.end(),
                     [](const LatticeChunk& c) { return c.embedding; });
}

bool LatticeStagePart::has_head() const {
  return std::any_of(chunks.begin(), chunks.end(), [](const LatticeChunk& c) { return c.head; });
}

std::vector<int64_t> lattice_layers_per_chunk(const ModelSpec& model, int64_t p, int64_t v) {
  const int64_t chunks = p * v, layers = model.n_layers;
  if (p < 1 || v < 1 || layers < chunks) {
    LATTICE_THROW(ConfigError,
                  "{} layers cannot fill p·v = {}·{} pipeline chunks of at least one layer ---> "
                  "HINT: use fewer pipeline stages or virtual stages",
                  layers, p, v);
  }
  // train/pipeline_stage.cpp partition_model's costs (forward FLOPs per token).
  const double C = double(model.d_model), F = double(model.d_ff), V = double(model.vocab_size);
  const double KV = double(model.kv_dim()), T = double(model.max_seq_len);
  const double mlp_matrices = model.mlp == MlpKind::kSwiglu ? 3.0 : 2.0;
  const double layer_weights = C * (C + 2 * KV) + C * C + mlp_matrices * C * F;
  const ChunkCompute cost(2.0 * layer_weights + 2.0 * T * C, layers, 2.0 * C * V, chunks);
  const double bottleneck = min_max_compute(cost);

  // Among partitions at that bottleneck the most even. even[k][i]: the least Σ compute² of
  // layers [i, L) in chunks k … p·v − 1 (+inf: none).
  auto usable = [&](int64_t k, int64_t a, int64_t b) { return cost.of(k, a, b) <= bottleneck; };
  std::vector<std::vector<double>> even(size_t(chunks + 1),
                                        std::vector<double>(size_t(layers + 1), kInfinity));
  even[size_t(chunks)][size_t(layers)] = 0.0;
  auto candidate = [&](int64_t k, int64_t i, int64_t e) {
    const double c = cost.of(k, i, e);
    return c * c + even[size_t(k + 1)][size_t(e)];
  };
  for (int64_t k = chunks - 1; k >= 0; --k)
    for (int64_t i = k; i <= layers - (chunks - k); ++i)
      for (int64_t e = i + 1; e <= layers - (chunks - k - 1); ++e)
        if (even[size_t(k + 1)][size_t(e)] != kInfinity && usable(k, i, e))
          even[size_t(k)][size_t(i)] = std::min(even[size_t(k)][size_t(i)], candidate(k, i, e));

  // Walk forwards; at a tie the earlier chunk takes more layers.
  std::vector<int64_t> counts;
  int64_t i = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    int64_t end = -1;
    for (int64_t e = layers - (chunks - k - 1); e > i && end < 0; --e)
      if (even[size_t(k + 1)][size_t(e)] != kInfinity && usable(k, i, e) &&
          candidate(k, i, e) == even[size_t(k)][size_t(i)])
        end = e;
    LATTICE_CHECK(end > i, "planner stage partition lost its optimum at chunk {} (layer {})", k, i);
    counts.push_back(end - i);
    i = end;
  }
  return counts;
}

LatticeStagePart lattice_stage_part(const ModelSpec& model, int64_t p, int64_t v, int64_t stage) {
  LatticeStagePart part;
  if (p * v <= 1) {
    part.chunks.push_back({0, model.n_layers, true, true});
    return part;
  }
  const std::vector<int64_t> counts = lattice_layers_per_chunk(model, p, v);
  int64_t first = 0;
  for (int64_t k = 0; k < p * v; ++k) {
    const int64_t last = first + counts[size_t(k)];
    if (k % p == stage) part.chunks.push_back({first, last, k == 0, k == p * v - 1});
    first = last;
  }
  return part;
}

int64_t lattice_activation_slots(Schedule schedule, int64_t p, int64_t m, int64_t v,
                                 int64_t stage) {
  if (p <= 1) return 1;
  // The runtime counts a micro-batch live until its weight pass: zb-h1 delays those, so every
  // stage holds min(m, p), not 1F1B's min(m, p − stage) of chunks_in_flight.
  if (schedule == Schedule::kZbH1) return std::min(m, p);
  return std::min(chunks_in_flight(schedule, p, m, v, stage), m);
}

}  // namespace lattice::plan
