// The sharded format with several (simulated) ranks in one process: each rank writes only what
// it owns (row ranges of a tp split, element ranges of a ZeRO partition, a replicated tensor by
// its owner only), the manifest records every piece, and a load assembles any slice of any
// global tensor from them, bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include "ckpt/shard_reader.h"
#include "ckpt/shard_writer.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

// Values unique per tensor and element, exactly representable in f32 and bf16.
Tensor iota(Arena& arena, Shape shape, DType dtype, float base) {
  Tensor f = Tensor::empty(arena, shape, DType::kF32);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = base + float(i);
  if (dtype == DType::kF32) return f;
  Tensor t = Tensor::empty(arena, shape, dtype);
  t.copy_from(f);
  return t;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct Globals {
  Tensor w, b, m, e;  // (6, 4) tp-split by rows; (4) replicated; (5, 3) ZeRO-split; bf16 (3, 2)
};

Globals make_globals(Arena& arena) {
  return {iota(arena, {6, 4}, DType::kF32, 0), iota(arena, {4}, DType::kF32, 100),
          iota(arena, {5, 3}, DType::kF32, 200), iota(arena, {3, 2}, DType::kBF16, 8)};
}

Tensor flat_slice(const Tensor& t, int64_t begin, int64_t end) {
  return t.view(Shape{t.numel()}).slice_rows(begin, end);
}

// What rank r of a 4-rank layout owns.
std::vector<OwnedShard> owned_by(int rank, const Globals& g) {
  std::vector<OwnedShard> shards;
  if (rank < 2) {  // tp=2 split of w by rows
    shards.push_back(OwnedShard::rows("w", g.w.shape(), 3 * rank, 3 * rank + 3,
                                      g.w.slice_rows(3 * rank, 3 * rank + 3)));
  }
  if (rank == 0) shards.push_back(OwnedShard::whole("b", g.b));  // replicated: owner only
  const int64_t cuts[] = {0, 4, 11, 15, 15};  // ZeRO: uneven flat partition, rank 3 holds none
  if (rank < 3) {
    shards.push_back(OwnedShard::elements("m", g.m.shape(), cuts[rank], cuts[rank + 1],
                                          flat_slice(g.m, cuts[rank], cuts[rank + 1])));
  }
  if (rank == 3) shards.push_back(OwnedShard::whole("e", g.e));
  return shards;
}

Manifest header(int64_t step) {
  Manifest m;
  m.step = step;
  m.layout = {2, 2, 1, 1, 1};
  m.state = {{"note", "test"}};
  return m;
}

fs::path write_four_ranks(const fs::path& root_dir, const Globals& g, int64_t step) {
  CheckpointRoot root(root_dir);
  fs::path staging = root.prepare_staging(step);
  std::vector<RankWriteResult> gathered;
  for (int rank = 0; rank < 4; ++rank) {
    // Through JSON, as the results travel between ranks.
    std::string wire =
        rank_write_result_to_json(write_rank_shards(staging, rank, owned_by(rank, g))).dump();
    gathered.push_back(rank_write_result_from_json(nlohmann::json::parse(wire)));
  }
  return root.commit(header(step), gathered);
}

TEST(ShardedCheckpoint, EveryRankWritesItsPiecesAndLoadsAssembleGlobalTensors) {
  fs::path root = testing::scratch_dir("four_ranks");
  Arena arena("test");
  Globals g = make_globals(arena);
  fs::path dir = write_four_ranks(root, g, 7);
  EXPECT_EQ(dir, root / "step_7");

  CheckpointReader reader(dir);
  const Manifest& m = reader.manifest();
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.layout, (CheckpointLayout{2, 2, 1, 1, 1}));
  EXPECT_EQ(m.state["note"], "test");
  ASSERT_EQ(m.files.size(), 4u);
  ASSERT_EQ(m.tensors.size(), 4u);
  EXPECT_EQ(reader.tensor("w").shards.size(), 2u);
  EXPECT_EQ(reader.tensor("b").shards.size(), 1u);  // written once, by its owner
  EXPECT_EQ(reader.tensor("m").shards.size(), 3u);
  EXPECT_EQ(reader.tensor("e").dtype, DType::kBF16);

  for (auto [name, original] : {std::pair{"w", g.w}, {"b", g.b}, {"m", g.m}, {"e", g.e}}) {
    Tensor loaded = Tensor::zeros(arena, original.shape(), original.dtype());
    reader.read_global(name, loaded);
    EXPECT_TRUE(bitwise_equal(loaded, original)) << name;
  }
  // Another layout's slices: rows straddling the tp cut, elements straddling two ZeRO cuts.
  Tensor rows = Tensor::zeros(arena, {3, 4}, DType::kF32);
  reader.read_global_rows("w", 2, 5, rows);
  EXPECT_TRUE(bitwise_equal(rows, g.w.slice_rows(2, 5)));
  Tensor elements = Tensor::zeros(arena, {9}, DType::kF32);
  reader.read_global_elements("m", 3, 12, elements);
  EXPECT_TRUE(bitwise_equal(elements, flat_slice(g.m, 3, 12)));
}

TEST(ShardedCheckpoint, DTypeAndShapeMismatchesListBothUnlessConversionIsAsked) {
  fs::path root = testing::scratch_dir("mismatch");
  Arena arena("test");
  Globals g = make_globals(arena);
  CheckpointReader reader(write_four_ranks(root, g, 1));

  Tensor as_f32 = Tensor::zeros(arena, {3, 2}, DType::kF32);
  try {
    reader.read_global("e", as_f32);
    FAIL() << "a bf16 tensor read into f32 without asking";
  } catch (const DTypeError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("stored as bf16, the destination is f32"), std::string::npos) << what;
  }
  reader.read_global("e", as_f32, DTypePolicy::kConvert);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(as_f32.data<float>()[i], 8.0f + float(i));

  Tensor wrong = Tensor::zeros(arena, {4, 6}, DType::kF32);
  try {
    reader.read_global("w", wrong);
    FAIL() << "a (6, 4) tensor read into (4, 6)";
  } catch (const ShapeError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("[6, 4]"), std::string::npos) << what;
    EXPECT_NE(what.find("f32[4, 6]"), std::string::npos) << what;
  }
  EXPECT_THROW(reader.tensor("absent"), IoError);
}

TEST(ShardedCheckpoint, CommitRefusesTensorsNotCoveredExactlyOnce) {
  fs::path root_dir = testing::scratch_dir("coverage");
  Arena arena("test");
  Globals g = make_globals(arena);
  CheckpointRoot root(root_dir);
  fs::path staging = root.prepare_staging(3);
  // Ranks 0 and 1 only: m lacks its last piece.
  std::vector<RankWriteResult> partial{write_rank_shards(staging, 0, owned_by(0, g)),
                                       write_rank_shards(staging, 1, owned_by(1, g))};
  try {
    root.commit(header(3), partial);
    FAIL() << "committed a checkpoint with a gap";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'm' [5, 3] is not covered exactly once"),
              std::string::npos)
        << e.what();
  }
  // Every piece, plus one of w written a second time: an overlap.
  partial.push_back(write_rank_shards(staging, 2, owned_by(2, g)));
  partial.push_back(write_rank_shards(staging, 3, owned_by(3, g)));
  std::vector<OwnedShard> again{OwnedShard::rows("w", g.w.shape(), 2, 3, g.w.slice_rows(2, 3))};
  partial.push_back(write_rank_shards(staging, 4, again));
  try {
    root.commit(header(3), partial);
    FAIL() << "committed a checkpoint with an overlap";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(root.step_dir(3)));
  EXPECT_TRUE(root.committed_steps().empty());
}

TEST(ShardedCheckpoint, RanksDisagreeingOnAGlobalShapeAreRefused) {
  Arena arena("test");
  Tensor a = iota(arena, {2, 4}, DType::kF32, 0);
  auto result = [](std::string file, Shape shape) {
    RankWriteResult r;
    r.file.name = file;
    TensorRecord t;
    t.name = "w";
    t.shape = shape;
    t.shards.push_back({file, "w", ShardBox::whole(shape)});
    r.tensors.push_back(t);
    return r;
  };
  RankWriteResult r0 = result("rank_00000.safetensors", Shape{4, 4});
  RankWriteResult r1 = result("rank_00001.safetensors", Shape{4, 5});
  Manifest m;
  EXPECT_THROW(merge_rank_results({r0, r1}, m), ValueError);
  fs::path dir = testing::scratch_dir("bad_shard");
  EXPECT_THROW(write_rank_shards(dir, 0, {OwnedShard::rows("w", Shape{4, 4}, 0, 3, a)}), ValueError)
      << "3 rows of 4 are not the 8 elements given";
}

}  // namespace
}  // namespace lattice
