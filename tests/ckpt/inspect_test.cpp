// `lattice ckpt inspect`'s report: what the checkpoint holds and whether it verifies.
#include "ckpt/inspect.h"

#include <gtest/gtest.h>

#include <fstream>

#include "ckpt/shard_writer.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

TEST(InspectCheckpoint, ListsLayoutTensorsShardsFilesAndStatus) {
  fs::path root_dir = testing::scratch_dir("inspect");
  Arena arena("test");
  Tensor w = Tensor::zeros(arena, {6, 4}, DType::kBF16);
  CheckpointRoot root(root_dir);
  Manifest m;
  m.step = 12;
  m.layout = {1, 2, 1, 1, 0};
  m.state = {{"lr_step", 12}};
  fs::path staging = root.prepare_staging(12);
  std::vector<RankWriteResult> results{
      write_rank_shards(staging, 0, {OwnedShard::rows("w", w.shape(), 0, 2, w.slice_rows(0, 2))}),
      write_rank_shards(staging, 1, {OwnedShard::rows("w", w.shape(), 2, 6, w.slice_rows(2, 6))})};
  fs::path dir = root.commit(m, results);

  CheckpointReport report = inspect_checkpoint(root_dir);  // the root: describes the newest
  EXPECT_TRUE(report.valid);
  const std::string& text = report.text;
  for (const char* expected : {"steps 12, latest -> step_12", "step        12",
                               "dp=1 tp=2 pp=1 v=1 zero=0", "\"lr_step\":12", "bf16 [6, 4]",
                               "2 shards: rank_00000.safetensors[0:2, 0:4] "
                               "rank_00001.safetensors[2:6, 0:4]",
                               "format      3", "files       2", "status      valid"}) {
    EXPECT_NE(text.find(expected), std::string::npos) << "missing '" << expected << "' in\n"
                                                      << text;
  }

  fs::resize_file(dir / rank_file_name(1), 10);
  CheckpointReport damaged = inspect_checkpoint(dir, /*verify=*/false);
  EXPECT_FALSE(damaged.valid);
  EXPECT_NE(damaged.text.find("INVALID: checkpoint file"), std::string::npos) << damaged.text;
  EXPECT_NE(damaged.text.find("rank_00001.safetensors"), std::string::npos) << damaged.text;

  EXPECT_THROW(inspect_checkpoint(testing::scratch_dir("inspect_empty")), IoError);
}

}  // namespace
}  // namespace lattice
