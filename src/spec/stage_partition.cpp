#include "spec/stage_partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace lattice {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

void check_cost(const StageCost& cost, const std::string& what) {
  const bool valid = std::isfinite(cost.compute) && std::isfinite(cost.memory) &&
                     cost.compute >= 0.0 && cost.memory >= 0.0;
  if (!valid)
    LATTICE_THROW(ConfigError,
                  "stage partition: {} has cost (compute {}, memory {}); both must be finite and "
                  ">= 0",
                  what, cost.compute, cost.memory);
}

// Costs of every candidate chunk [a, b) as model chunk k, from prefix sums so that the same chunk
// always yields bitwise the same numbers (the search compares them for equality).
class ChunkCosts {
 public:
  explicit ChunkCosts(const StagePartitionInput& input)
      : input_(input), chunks_(input.stages * input.virtual_stages) {
    compute_.push_back(0.0);
    memory_.push_back(0.0);
    for (const StageCost& layer : input.layers) {
      compute_.push_back(compute_.back() + layer.compute);
      memory_.push_back(memory_.back() + layer.memory);
    }
  }
  int chunks() const { return chunks_; }
  int layers() const { return int(input_.layers.size()); }
  StageCost of(int k, int a, int b) const {
    StageCost cost{compute_[size_t(b)] - compute_[size_t(a)],
                   memory_[size_t(b)] - memory_[size_t(a)]};
    if (k == 0) {
      cost.compute += input_.embedding.compute;
      cost.memory += input_.embedding.memory;
    }
    if (k == chunks_ - 1) {
      cost.compute += input_.head.compute;
      cost.memory += input_.head.memory;
    }
    return cost;
  }
  bool fits(int k, int a, int b) const { return of(k, a, b).memory <= input_.max_chunk_memory; }

 private:
  const StagePartitionInput& input_;
  int chunks_;
  std::vector<double> compute_;  // (L + 1) prefix sums
  std::vector<double> memory_;
};

// The smallest possible max over chunks of `measure`, over partitions where `allowed` holds for
// every chunk; +inf when there is none. best[k][i]: first i layers in k chunks, ≥ 1 layer each.
template <typename Measure, typename Allowed>
double min_max_partition(const ChunkCosts& costs, Measure measure, Allowed allowed) {
  const int chunks = costs.chunks(), layers = costs.layers();
  std::vector<std::vector<double>> best(size_t(chunks + 1),
                                        std::vector<double>(size_t(layers + 1), kInfinity));
  best[0][0] = 0.0;
  for (int k = 1; k <= chunks; ++k)
    for (int i = k; i <= layers; ++i)
      for (int a = k - 1; a < i; ++a) {
        if (best[size_t(k - 1)][size_t(a)] == kInfinity || !allowed(k - 1, a, i)) continue;
        const double bottleneck = std::max(best[size_t(k - 1)][size_t(a)], measure(k - 1, a, i));
        best[size_t(k)][size_t(i)] = std::min(best[size_t(k)][size_t(i)], bottleneck);
      }
  return best[size_t(chunks)][size_t(layers)];
}

StagePartition assemble(const StagePartitionInput& input, const ChunkCosts& costs,
                        const std::vector<int>& layers_per_chunk) {
  StagePartition partition;
  int first = 0;
  for (int k = 0; k < costs.chunks(); ++k) {
    const int last = first + layers_per_chunk[size_t(k)];
    ChunkLayers chunk;
    chunk.model_chunk = k;
    chunk.stage = k % input.stages;
    chunk.local_chunk = k / input.stages;
    chunk.first_layer = first;
    chunk.last_layer = last;
    chunk.has_embedding = k == 0;
    chunk.has_head = k == costs.chunks() - 1;
    chunk.cost = costs.of(k, first, last);
    partition.max_compute = std::max(partition.max_compute, chunk.cost.compute);
    partition.max_memory = std::max(partition.max_memory, chunk.cost.memory);
    partition.chunks.push_back(chunk);
    first = last;
  }
  return partition;
}

void check_input(const StagePartitionInput& input) {
  if (input.stages < 1 || input.virtual_stages < 1)
    LATTICE_THROW(ConfigError,
                  "stage partition: stages p={} and virtual stages v={} must both be >= 1",
                  input.stages, input.virtual_stages);
  const auto chunks = size_t(input.stages * input.virtual_stages);
  if (input.layers.size() < chunks)
    LATTICE_THROW(ConfigError,
                  "stage partition: {} layers cannot fill p·v = {}·{} = {} chunks of at least "
                  "one layer ---> HINT: use fewer pipeline stages or virtual stages",
                  input.layers.size(), input.stages, input.virtual_stages, chunks);
  for (size_t l = 0; l < input.layers.size(); ++l)
    check_cost(input.layers[l], fmt::format("layer {}", l));
  check_cost(input.embedding, "the embedding");
  check_cost(input.head, "the head");
  if (std::isnan(input.max_chunk_memory) || input.max_chunk_memory <= 0.0)
    LATTICE_THROW(ConfigError, "stage partition: max_chunk_memory {} must be > 0",
                  input.max_chunk_memory);
}

}  // namespace

StagePartition partition_stages(const StagePartitionInput& input) {
  check_input(input);
  const ChunkCosts costs(input);
  const int chunks = costs.chunks(), layers = costs.layers();
  auto compute = [&](int k, int a, int b) { return costs.of(k, a, b).compute; };
  auto fits = [&](int k, int a, int b) { return costs.fits(k, a, b); };

  const double bottleneck = min_max_partition(costs, compute, fits);
  if (bottleneck == kInfinity) {
    auto memory = [&](int k, int a, int b) { return costs.of(k, a, b).memory; };
    const double smallest = min_max_partition(costs, memory, [](int, int, int) { return true; });
    LATTICE_THROW(ConfigError,
                  "stage partition: no split of {} layers into {} chunks keeps every chunk "
                  "within max_chunk_memory {}; the best split needs {} ---> HINT: raise the "
                  "memory budget to at least {}, or use more pipeline stages",
                  layers, chunks, input.max_chunk_memory, smallest, smallest);
  }

  // Among partitions at that bottleneck, the most even: least Σ compute² over chunks.
  // even[k][i]: the least Σ compute² of layers [i, L) in chunks k … p·v − 1 (+inf: none).
  auto usable = [&](int k, int a, int b) {
    return fits(k, a, b) && compute(k, a, b) <= bottleneck;
  };
  std::vector<std::vector<double>> even(size_t(chunks + 1),
                                        std::vector<double>(size_t(layers + 1), kInfinity));
  even[size_t(chunks)][size_t(layers)] = 0.0;
  auto candidate = [&](int k, int i, int e) {
    const double c = compute(k, i, e);
    return c * c + even[size_t(k + 1)][size_t(e)];
  };
  for (int k = chunks - 1; k >= 0; --k)
    for (int i = k; i <= layers - (chunks - k); ++i)
      for (int e = i + 1; e <= layers - (chunks - k - 1); ++e)
        if (even[size_t(k + 1)][size_t(e)] != kInfinity && usable(k, i, e))
          even[size_t(k)][size_t(i)] = std::min(even[size_t(k)][size_t(i)], candidate(k, i, e));

  // Walk forwards; at a tie the earlier chunk takes more layers.
  std::vector<int> layers_per_chunk;
  int i = 0;
  for (int k = 0; k < chunks; ++k) {
    int end = -1;
    for (int e = layers - (chunks - k - 1); e > i && end < 0; --e)
      if (even[size_t(k + 1)][size_t(e)] != kInfinity && usable(k, i, e) &&
          candidate(k, i, e) == even[size_t(k)][size_t(i)])
        end = e;
    LATTICE_CHECK(end > i, "stage partition lost its optimum at chunk {} (layer {})", k, i);
    layers_per_chunk.push_back(end - i);
    i = end;
  }
  return assemble(input, costs, layers_per_chunk);
}

StagePartition partition_stages(const StagePartitionInput& input,
                                const std::vector<int>& layers_per_chunk) {
  check_input(input);
  const ChunkCosts costs(input);
  const std::string hint =
      fmt::format(" ---> HINT: give {} layer counts (p·v = {}·{}), each >= 1, summing to {}",
                  costs.chunks(), input.stages, input.virtual_stages, costs.layers());
  if (layers_per_chunk.size() != size_t(costs.chunks()))
    LATTICE_THROW(ConfigError, "stage partition override: {} layer counts for {} chunks{}",
                  layers_per_chunk.size(), costs.chunks(), hint);
  int total = 0;
  for (size_t k = 0; k < layers_per_chunk.size(); ++k) {
    if (layers_per_chunk[k] < 1)
      LATTICE_THROW(ConfigError,
                    "stage partition override: chunk {} gets {} layers; every chunk needs at "
                    "least one{}",
                    k, layers_per_chunk[k], hint);
    total += layers_per_chunk[k];
  }
  if (total != costs.layers())
    LATTICE_THROW(ConfigError,
                  "stage partition override: the counts sum to {} but the model has "
                  "{} layers{}",
                  total, costs.layers(), hint);
  StagePartition partition = assemble(input, costs, layers_per_chunk);
  for (const ChunkLayers& chunk : partition.chunks)
    if (chunk.cost.memory > input.max_chunk_memory)
      LATTICE_THROW(ConfigError,
                    "stage partition override: chunk {} (layers [{}, {})) needs memory {} over "
                    "max_chunk_memory {} ---> HINT: move layers off it",
                    chunk.model_chunk, chunk.first_layer, chunk.last_layer, chunk.cost.memory,
                    input.max_chunk_memory);
  return partition;
}

}  // namespace lattice
