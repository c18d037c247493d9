// Manifest format v3: shards are boxes; a tensor's boxes (and flat ranges) must tile it exactly
// once, and a gap or an overlap is refused naming the tensor and the shards. A format-2
// manifest (flat ranges as "begin"/"end") still loads, also into tensor-parallel shards.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "ckpt/checkpoint.h"
#include "core/crc32c.h"
#include "core/philox.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

RankWriteResult holding(const std::string& file, const Shape& shape,
                        const std::vector<ShardBox>& boxes) {
  RankWriteResult r;
  r.file.name = file;
  TensorRecord t{"w", shape, DType::kF32, {}};
  int k = 0;
  for (const ShardBox& box : boxes) t.shards.push_back({file, fmt::format("w{}", k++), box});
  r.tensors.push_back(t);
  return r;
}

std::string merge_error(const std::vector<RankWriteResult>& results) {
  Manifest m;
  try {
    merge_rank_results(results, m);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(BoxManifest, BoxesAndFlatRangesThatTileATensorAreAccepted) {
  const Shape shape{6, 4};
  // Columns 0..1 of every row from one rank, rows 0..2 of columns 2..3 from another, and the
  // rest as a flat range (elements of rows 3..5, columns 2..3 are not contiguous: two boxes).
  EXPECT_EQ(merge_error({holding("a", shape, {ShardBox{{0, 0}, {6, 2}}}),
                         holding("b", shape,
                                 {ShardBox{{0, 2}, {3, 2}}, ShardBox{{3, 2}, {2, 2}},
                                  ShardBox{{5, 2}, {1, 2}}})}),
            "");
  EXPECT_EQ(merge_error({holding("a", shape, {ShardBox{{0, 0}, {3, 4}}}),
                         holding("b", shape, {ShardBox::flat(12, 24)})}),
            "");
}

TEST(BoxManifest, AGapOrAnOverlapIsRefusedNamingTheTensorAndTheShards) {
  const Shape shape{6, 4};
  std::string gap = merge_error({holding("a", shape, {ShardBox{{0, 0}, {6, 2}}}),
                                 holding("b", shape, {ShardBox{{0, 2}, {5, 2}}})});
  EXPECT_NE(gap.find("tensor 'w' [6, 4] is not covered exactly once: its shards hold 22 of 24"),
            std::string::npos)
      << gap;
  std::string overlap = merge_error({holding("a", shape, {ShardBox{{0, 0}, {6, 3}}}),
                                     holding("b", shape, {ShardBox{{0, 2}, {6, 2}}})});
  EXPECT_NE(overlap.find("tensor 'w' [6, 4] is not covered exactly once: shard [0:6, 0:3]"),
            std::string::npos)
      << overlap;
  EXPECT_NE(overlap.find("shard [0:6, 2:4] ('w0' in 'b') overlap"), std::string::npos) << overlap;
  // A flat range overlapping a box, with the sizes adding up (so only the overlap check sees it).
  std::string mixed = merge_error({holding("a", shape, {ShardBox{{0, 0}, {3, 4}}}),
                                   holding("b", shape, {ShardBox::flat(11, 23)})});
  EXPECT_NE(mixed.find("overlap"), std::string::npos) << mixed;
  std::string outside = merge_error({holding("a", shape, {ShardBox{{0, 0}, {7, 4}}})});
  EXPECT_NE(outside.find("tensor 'w' [6, 4], shard 'w0' in 'a': box [0:7, 0:4] lies outside"),
            std::string::npos)
      << outside;
}

// Rewrites a committed format-3 manifest the way the format-2 writer wrote it.
void downgrade_to_format_2(const fs::path& dir) {
  std::ifstream in(dir / kManifestFileName);
  nlohmann::json body = nlohmann::json::parse(in);
  body.erase("manifest_crc32c");
  body["format_version"] = 2;
  for (nlohmann::json& t : body["tensors"]) {
    int64_t numel = 1;
    for (const auto& d : t["shape"]) numel *= d.get<int64_t>();
    for (nlohmann::json& s : t["shards"]) {
      auto offsets = s["offsets"].get<std::vector<int64_t>>();
      auto lengths = s["lengths"].get<std::vector<int64_t>>();
      ASSERT_TRUE(offsets.size() == 1 || (s["key"] == t["name"]))
          << "only whole tensors and flat ranges exist in format 2";
      const int64_t begin = offsets.size() == 1 ? offsets[0] : 0;
      const int64_t end = offsets.size() == 1 ? offsets[0] + lengths[0] : numel;
      s.erase("offsets");
      s.erase("lengths");
      s["begin"] = begin;
      s["end"] = end;
    }
  }
  body["manifest_crc32c"] = crc32c([&] {
    nlohmann::json copy = body;
    copy.erase("manifest_crc32c");
    return copy.dump();
  }());
  std::ofstream(dir / kManifestFileName) << body.dump(1) << "\n";
}

TEST(BoxManifest, AFormatTwoCheckpointStillLoadsAlsoIntoTensorParallelShards) {
  Arena arena("test");
  TrainConfig config;
  config.model = model_preset("llama-tiny");
  Transformer model(config.model, arena, DType::kF32);
  model.initialize(3);
  AdamW optimizer(model.parameters(), arena, config.adam);
  Tensor& g = model.parameters().grads();
  fill_normal(g.data<float>(), g.numel(), 3, 0, 0, 0.0f, 0.1f);
  optimizer.step(1e-3f);
  TrainingState state{.step = 1, .lr_step = 1, .data = {}, .seed = 3};
  fs::path dir =
      save_training_checkpoint(testing::scratch_dir("format2"), config, model, optimizer, state);
  downgrade_to_format_2(dir);

  CheckpointReader reader(dir);
  EXPECT_EQ(reader.manifest().format_version, 2);
  Transformer fresh(config.model, arena, DType::kF32);
  AdamW fresh_optimizer(fresh.parameters(), arena, config.adam);
  EXPECT_EQ(load_training_checkpoint(dir, fresh, fresh_optimizer), state);
  const Tensor& a = model.parameters().master();
  const Tensor& b = fresh.parameters().master();
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
  EXPECT_EQ(
      std::memcmp(optimizer.v().raw_data(), fresh_optimizer.v().raw_data(), optimizer.v().nbytes()),
      0);

  // Each tp-4 rank's shards (kv projections replicated) are the slices of the saved tensors.
  for (int rank = 0; rank < 4; ++rank) {
    ParameterRegistry registry(config.model, {4, rank, false});
    ParameterStore store(registry, arena, DType::kF32);
    for (int i = 0; i < int(registry.specs().size()); ++i) {
      const ParameterSpec& spec = registry.at(i);
      reader.read_local(spec.name, spec.shard, store.master(i));
      const float* global = model.parameters().master(i).data<float>();
      const float* local = store.master(i).data<float>();
      for_each_shard_run(spec.shape, spec.shard, [&](int64_t gi, int64_t li, int64_t n) {
        EXPECT_EQ(std::memcmp(local + li, global + gi, size_t(n) * sizeof(float)), 0)
            << spec.name << " rank " << rank;
      });
    }
  }
}

}  // namespace
}  // namespace lattice
