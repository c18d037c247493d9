// A damaged checkpoint is an error naming the file and the tensor, never a silent load; and
// resume_auto passes over damaged ones (a bounded number of times), saying which and why.
#include <gtest/gtest.h>

#include <fstream>

#include "ckpt/safetensors.h"
#include "ckpt/shard_reader.h"
#include "ckpt/shard_writer.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

// Two ranks' files: "a" split by rows over both, "b" whole in rank 1's file.
struct Saved {
  Arena arena{"test"};
  Tensor a = Tensor::empty(arena, {16, 8}, DType::kF32);
  Tensor b = Tensor::empty(arena, {32}, DType::kF32);

  fs::path save(const CheckpointRoot& root, int64_t step) {
    for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = float(step * 1000 + i);
    for (int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] = float(-i);
    fs::path staging = root.prepare_staging(step);
    std::vector<RankWriteResult> results{
        write_rank_shards(staging, 0,
                          {OwnedShard::rows("a", a.shape(), 0, 10, a.slice_rows(0, 10))}),
        write_rank_shards(staging, 1,
                          {OwnedShard::rows("a", a.shape(), 10, 16, a.slice_rows(10, 16)),
                           OwnedShard::whole("b", b)})};
    Manifest m;
    m.step = step;
    return root.commit(m, results);
  }
};

void flip_byte(const fs::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(offset));
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x20);
  f.seekp(std::streamoff(offset));
  f.write(&c, 1);
}

std::string load_error(const fs::path& dir) {
  try {
    CheckpointReader reader(dir);
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

uint64_t data_start(const fs::path& file) {
  SafetensorsReader reader(file);
  return fs::file_size(file) - (reader.info("b").data_end);  // data buffer starts here
}

enum class Damage { kTruncate, kFlipData, kFlipHeader, kFlipManifest, kDeleteShard };

class CorruptionTest : public ::testing::TestWithParam<Damage> {};

TEST_P(CorruptionTest, IsAnErrorNamingFileAndTensorAndResumeFallsBack) {
  const Damage damage = GetParam();
  fs::path root_dir = testing::scratch_dir(fmt::format("corrupt_{}", int(damage)));
  CheckpointRoot root(root_dir);
  Saved saved;
  saved.save(root, 1);
  fs::path dir = saved.save(root, 2);
  ASSERT_EQ(load_error(dir), "");

  const fs::path shard = dir / rank_file_name(1);
  switch (damage) {
    case Damage::kTruncate:
      fs::resize_file(shard, fs::file_size(shard) - 5);
      break;
    case Damage::kFlipData:
      flip_byte(shard, data_start(shard) + 3);
      break;
    case Damage::kFlipHeader:
      flip_byte(shard, 12);
      break;
    case Damage::kFlipManifest:
      flip_byte(dir / kManifestFileName, 40);
      break;
    case Damage::kDeleteShard:
      fs::remove(shard);
      break;
  }
  std::string what = load_error(dir);
  ASSERT_NE(what, "") << "a damaged checkpoint loaded";
  if (damage == Damage::kFlipManifest) {
    EXPECT_NE(what.find("manifest.json"), std::string::npos) << what;
  } else {
    EXPECT_NE(what.find("rank_00001.safetensors"), std::string::npos) << what;
    EXPECT_NE(what.find("holding [a, b]"), std::string::npos) << what;
  }

  std::optional<ResumeChoice> choice = resume_auto(root_dir);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->step, 1);
  ASSERT_EQ(choice->skipped.size(), 1u);
  EXPECT_TRUE(choice->skipped[0].starts_with("step_2: ")) << choice->skipped[0];
}

INSTANTIATE_TEST_SUITE_P(EveryDamage, CorruptionTest,
                         ::testing::Values(Damage::kTruncate, Damage::kFlipData,
                                           Damage::kFlipHeader, Damage::kFlipManifest,
                                           Damage::kDeleteShard),
                         [](const auto& info) {
                           switch (info.param) {
                             case Damage::kTruncate:
                               return "truncate";
                             case Damage::kFlipData:
                               return "flip_data";
                             case Damage::kFlipHeader:
                               return "flip_header";
                             case Damage::kFlipManifest:
                               return "flip_manifest";
                             case Damage::kDeleteShard:
                               return "delete_shard";
                           }
                           return "unknown";
                         });

TEST(ResumeAuto, FallsBackABoundedNumberOfTimesThenListsWhatItSkipped) {
  fs::path root_dir = testing::scratch_dir("bounded");
  CheckpointRoot root(root_dir);
  Saved saved;
  for (int64_t step = 1; step <= 4; ++step) saved.save(root, step);
  for (int64_t step = 2; step <= 4; ++step) fs::remove(root.step_dir(step) / kManifestFileName);

  std::optional<ResumeChoice> within = resume_auto(root_dir, 3);
  ASSERT_TRUE(within.has_value());
  EXPECT_EQ(within->step, 1);
  EXPECT_EQ(within->skipped.size(), 3u);

  try {
    resume_auto(root_dir, 2);
    FAIL() << "fell back past the bound";
  } catch (const IoError& e) {
    std::string what = e.what();
    for (const char* step : {"step_4: ", "step_3: ", "step_2: "}) {
      EXPECT_NE(what.find(step), std::string::npos) << what;
    }
    EXPECT_NE(what.find("manifest.json"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace lattice
