// Stage partition: layers split over p·v chunks so the slowest chunk is as fast as possible
// within a memory cap, the embedding and head counted on their chunks, ties towards earlier
// chunks; plus the validated manual override.
#include "spec/stage_partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <tuple>

#include "core/error.h"

namespace lattice {
namespace {

StagePartitionInput uniform(int layers, int p, int v = 1, StageCost layer = {1.0, 1.0}) {
  StagePartitionInput input;
  input.layers.assign(size_t(layers), layer);
  input.stages = p;
  input.virtual_stages = v;
  return input;
}

std::vector<int> counts(const StagePartition& partition) {
  std::vector<int> out;
  for (const ChunkLayers& chunk : partition.chunks) out.push_back(chunk.layer_count());
  return out;
}

std::string config_error(const std::function<void()>& body) {
  try {
    body();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(StagePartition, EvenSplitAndChunkPlacement) {
  const StagePartition partition = partition_stages(uniform(8, 4));
  EXPECT_EQ(counts(partition), (std::vector<int>{2, 2, 2, 2}));
  for (int k = 0; k < 4; ++k) {
    const ChunkLayers& chunk = partition.chunks[size_t(k)];
    EXPECT_EQ(chunk.model_chunk, k);
    EXPECT_EQ(chunk.stage, k);
    EXPECT_EQ(chunk.local_chunk, 0);
    EXPECT_EQ(chunk.first_layer, 2 * k);
    EXPECT_EQ(chunk.last_layer, 2 * k + 2);
    EXPECT_EQ(chunk.has_embedding, k == 0);
    EXPECT_EQ(chunk.has_head, k == 3);
    EXPECT_EQ(chunk.cost.compute, 2.0);
  }
  EXPECT_EQ(partition.max_compute, 2.0);
  EXPECT_EQ(partition.max_memory, 2.0);
}

TEST(StagePartition, TiesGiveEarlierChunksMoreLayers) {
  EXPECT_EQ(counts(partition_stages(uniform(5, 2))), (std::vector<int>{3, 2}));
  EXPECT_EQ(counts(partition_stages(uniform(7, 4))), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(counts(partition_stages(uniform(10, 4))), (std::vector<int>{3, 3, 2, 2}));
}

TEST(StagePartition, EmbeddingAndHeadComputeShiftLayersAway) {
  StagePartitionInput input = uniform(8, 2);
  input.embedding = {2.0, 0.0};
  EXPECT_EQ(counts(partition_stages(input)), (std::vector<int>{3, 5}));  // 2+3 = 5 = 5
  input.embedding = {};
  input.head = {2.0, 0.0};
  EXPECT_EQ(counts(partition_stages(input)), (std::vector<int>{5, 3}));
  input.embedding = {2.0, 0.0};
  const StagePartition both = partition_stages(input);
  EXPECT_EQ(counts(both), (std::vector<int>{4, 4}));
  EXPECT_EQ(both.chunks[0].cost.compute, 6.0);
  EXPECT_EQ(both.chunks[1].cost.compute, 6.0);
}

TEST(StagePartition, InterleavedChunksWrapAroundTheStages) {
  StagePartitionInput input = uniform(8, 2, 2);
  input.embedding = {2.0, 0.0};
  // Bottleneck 3 forces chunk 0 down to one layer; among the splits of the other seven layers
  // at ≤ 3, {3,2,2} is the most even (Σ compute² = 26) and gives earlier chunks more.
  const StagePartition partition = partition_stages(input);
  EXPECT_EQ(counts(partition), (std::vector<int>{1, 3, 2, 2}));
  EXPECT_EQ(partition.max_compute, 3.0);
  const std::vector<std::pair<int, int>> placement = {{0, 0}, {1, 0}, {0, 1}, {1, 1}};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(partition.chunks[k].stage, placement[k].first);
    EXPECT_EQ(partition.chunks[k].local_chunk, placement[k].second);
  }
}

TEST(StagePartition, UnevenLayerCosts) {
  StagePartitionInput input = uniform(6, 3);
  const double compute[] = {4, 1, 1, 1, 1, 4};
  for (size_t l = 0; l < 6; ++l) input.layers[l].compute = compute[l];
  EXPECT_EQ(counts(partition_stages(input)), (std::vector<int>{1, 4, 1}));
}

TEST(StagePartition, MemoryCapMovesLayersOffTheEmbeddingStage) {
  StagePartitionInput input = uniform(8, 2);
  input.embedding = {0.0, 4.0};  // light in compute, heavy in memory
  input.max_chunk_memory = 8.0;
  EXPECT_EQ(counts(partition_stages(input)), (std::vector<int>{4, 4}));  // 4 + 4 = 8 fits
  input.max_chunk_memory = 7.0;
  const StagePartition capped = partition_stages(input);
  EXPECT_EQ(counts(capped), (std::vector<int>{3, 5}));
  EXPECT_EQ(capped.chunks[0].cost.memory, 7.0);
  EXPECT_EQ(capped.max_compute, 5.0);  // the price of the cap
  EXPECT_EQ(capped.max_memory, 7.0);

  input.max_chunk_memory = 5.0;  // the best split (2 layers + embedding | 6 layers) needs 6
  const std::string message = config_error([&] { partition_stages(input); });
  EXPECT_TRUE(contains(message, "max_chunk_memory 5")) << message;
  EXPECT_TRUE(contains(message, "raise the memory budget to at least 6")) << message;
}

// Every composition of L into K positive parts, for checking the search against brute force.
void compositions(int layers, int chunks, std::vector<int>& prefix,
                  const std::function<void(const std::vector<int>&)>& visit) {
  if (chunks == 1) {
    prefix.push_back(layers);
    visit(prefix);
    prefix.pop_back();
    return;
  }
  for (int first = 1; first <= layers - (chunks - 1); ++first) {
    prefix.push_back(first);
    compositions(layers - first, chunks - 1, prefix, visit);
    prefix.pop_back();
  }
}

TEST(StagePartition, MatchesBruteForceOnSmallCases) {
  uint32_t state = 12345;  // small integer costs from a fixed LCG: sums are exact in double
  auto next_cost = [&] {
    state = state * 1664525u + 1013904223u;
    return double((state >> 16) % 7);
  };
  int cases = 0, capped_out = 0;
  for (int layers = 2; layers <= 9; ++layers) {
    for (int p = 1; p <= 4; ++p) {
      for (int v = 1; v <= 2; ++v) {
        if (p * v > layers) continue;
        SCOPED_TRACE(::testing::Message() << "L=" << layers << " p=" << p << " v=" << v);
        StagePartitionInput input = uniform(layers, p, v);
        for (StageCost& layer : input.layers) layer = {next_cost(), next_cost()};
        input.embedding = {next_cost(), next_cost()};
        input.head = {next_cost(), next_cost()};
        input.max_chunk_memory = 14.0;

        // Brute force over every split within the cap: least max compute, then least
        // Σ compute², then the lexicographically largest counts.
        const int chunks = p * v;
        std::tuple<double, double> best_key{INFINITY, INFINITY};
        std::vector<int> best;
        std::vector<int> prefix;
        compositions(layers, chunks, prefix, [&](const std::vector<int>& split) {
          double max_compute = 0, squares = 0;
          int first = 0;
          for (int k = 0; k < chunks; ++k) {
            StageCost cost;
            for (int l = first; l < first + split[size_t(k)]; ++l) {
              cost.compute += input.layers[size_t(l)].compute;
              cost.memory += input.layers[size_t(l)].memory;
            }
            if (k == 0)
              cost = {cost.compute + input.embedding.compute, cost.memory + input.embedding.memory};
            if (k == chunks - 1)
              cost = {cost.compute + input.head.compute, cost.memory + input.head.memory};
            if (cost.memory > input.max_chunk_memory) return;
            max_compute = std::max(max_compute, cost.compute);
            squares += cost.compute * cost.compute;
            first += split[size_t(k)];
          }
          const auto key = std::make_tuple(max_compute, squares);
          if (key < best_key || (key == best_key && split > best)) {
            best_key = key;
            best = split;
          }
        });
        ++cases;
        if (best.empty()) {
          ++capped_out;
          EXPECT_THROW(partition_stages(input), ConfigError);
          continue;
        }
        const StagePartition partition = partition_stages(input);
        EXPECT_EQ(counts(partition), best);
        EXPECT_EQ(partition.max_compute, std::get<0>(best_key));
      }
    }
  }
  EXPECT_EQ(cases, 49);              // (L, p·v ≤ L) pairs swept
  EXPECT_GT(capped_out, 0);          // the cap binds in some cases…
  EXPECT_LT(capped_out, cases / 2);  // …but most have a split
}

TEST(StagePartitionOverride, UsesTheGivenCounts) {
  StagePartitionInput input = uniform(8, 2, 2);
  input.embedding = {0.5, 3.0};
  input.head = {1.5, 2.0};
  const StagePartition partition = partition_stages(input, {1, 3, 2, 2});
  EXPECT_EQ(counts(partition), (std::vector<int>{1, 3, 2, 2}));
  EXPECT_EQ(partition.chunks[1].first_layer, 1);
  EXPECT_EQ(partition.chunks[1].last_layer, 4);
  EXPECT_EQ(partition.chunks[0].cost.compute, 1.5);
  EXPECT_EQ(partition.chunks[0].cost.memory, 4.0);
  EXPECT_EQ(partition.chunks[3].cost.compute, 3.5);
  EXPECT_EQ(partition.chunks[3].cost.memory, 4.0);
  EXPECT_EQ(partition.max_compute, 3.5);
}

TEST(StagePartitionOverride, InvalidCountsAreConfigErrors) {
  const StagePartitionInput input = uniform(8, 2, 2);
  auto refused = [&](std::vector<int> layers_per_chunk) {
    return config_error([&] { partition_stages(input, layers_per_chunk); });
  };
  const std::string wrong_count = refused({4, 4});
  EXPECT_TRUE(contains(wrong_count, "2 layer counts for 4 chunks")) << wrong_count;
  EXPECT_TRUE(contains(wrong_count, "give 4 layer counts (p·v = 2·2)")) << wrong_count;
  EXPECT_TRUE(contains(refused({3, 0, 3, 2}), "chunk 1 gets 0 layers"));
  EXPECT_TRUE(contains(refused({3, -1, 4, 2}), "chunk 1 gets -1 layers"));
  const std::string wrong_sum = refused({3, 3, 2, 2});
  EXPECT_TRUE(contains(wrong_sum, "the counts sum to 10 but the model has 8 layers")) << wrong_sum;

  StagePartitionInput capped = uniform(8, 2);
  capped.max_chunk_memory = 4.0;
  const std::string over = config_error([&] { partition_stages(capped, {5, 3}); });
  EXPECT_TRUE(contains(over, "chunk 0 (layers [0, 5)) needs memory 5 over max_chunk_memory 4"))
      << over;
}

TEST(StagePartition, InvalidInputsAreConfigErrors) {
  EXPECT_TRUE(contains(config_error([] { partition_stages(uniform(7, 4, 2)); }),
                       "7 layers cannot fill p·v = 4·2 = 8 chunks"));
  EXPECT_TRUE(contains(config_error([] { partition_stages(uniform(4, 0)); }), "p=0"));
  StagePartitionInput negative = uniform(4, 2);
  negative.layers[2].compute = -1.0;
  EXPECT_TRUE(contains(config_error([&] { partition_stages(negative); }), "layer 2 has cost"));
  StagePartitionInput not_finite = uniform(4, 2);
  not_finite.head.memory = NAN;
  EXPECT_TRUE(contains(config_error([&] { partition_stages(not_finite); }), "the head has cost"));
}

}  // namespace
}  // namespace lattice
