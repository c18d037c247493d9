// `lattice export` of a model larger than the shard limit: the hub's sharded layout
// (model-0000k-of-0000n.safetensors + model.safetensors.index.json, as save_pretrained writes
// it), which --init-from reads back exactly; a later whole export replaces the shards.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "core/philox.h"
#include "scratch_dir.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

std::vector<float> logits_of(Transformer& model) {
  std::vector<int32_t> tokens(2 * 10);
  PhiloxStream rng(9, 9);
  for (auto& t : tokens) t = int32_t(rng.next_below(uint64_t(model.config().vocab_size)));
  model.forward(Tensor::borrow(tokens.data(), {2, 10}, DType::kI32), Tensor());
  const Tensor& l = model.logits();
  return std::vector<float>(l.data<float>(), l.data<float>() + l.numel());
}

std::vector<std::string> weight_files(const fs::path& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(HfExport, ALargeModelIsShardedTheHubsWayAndLoadsBackExactly) {
  const fs::path dir = testing::scratch_dir("hf_export_shards");
  Arena arena("test");
  const ModelConfig config = model_preset("gpt2-tiny");
  Transformer original(config, arena, DType::kF32);
  original.initialize(3);
  constexpr uint64_t kLimit = 100'000;  // gpt2-tiny's ~0.5 MB of f32 weights: several files
  export_hf(dir, original, {.max_shard_bytes = kLimit});

  std::ifstream in(dir / "model.safetensors.index.json");
  ASSERT_TRUE(in) << "no index";
  const nlohmann::json index = nlohmann::json::parse(in);
  const std::vector<std::string> files = weight_files(dir);
  ASSERT_GE(files.size(), 3u);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  const std::string n = fmt::format("{:05d}", files.size());
  uint64_t total = 0;
  size_t tensors = 0;
  std::set<std::string> mapped;
  for (size_t k = 0; k < files.size(); ++k) {
    EXPECT_EQ(files[k], fmt::format("model-{:05d}-of-{}.safetensors", k + 1, n));
    SafetensorsReader shard(dir / files[k]);
    uint64_t bytes = 0;
    for (const SafetensorsTensorInfo& t : shard.tensors()) {
      EXPECT_EQ(index["weight_map"][t.name], files[k]) << t.name;
      mapped.insert(t.name);
      bytes += uint64_t(t.shape.numel()) * 4;
      ++tensors;
    }
    // Within the limit, unless one tensor alone exceeds it.
    EXPECT_TRUE(bytes <= kLimit || shard.tensors().size() == 1) << files[k] << ": " << bytes;
    total += bytes;
  }
  EXPECT_EQ(index["weight_map"].size(), tensors);
  EXPECT_EQ(mapped.size(), tensors);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);

  Transformer loaded(config, arena, DType::kF32);
  loaded.initialize(4);
  load_hf_weights(dir, loaded);
  EXPECT_EQ(logits_of(original), logits_of(loaded));

  // A whole export into the same directory leaves no shard or index behind to shadow it.
  export_hf(dir, loaded);
  EXPECT_EQ(weight_files(dir), std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  Transformer again(config, arena, DType::kF32);
  again.initialize(5);
  load_hf_weights(dir, again);
  EXPECT_EQ(logits_of(original), logits_of(again));
}

}  // namespace
}  // namespace lattice
