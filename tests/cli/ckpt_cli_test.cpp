// `lattice ckpt inspect` through the executable: the tensors a checkpoint holds and its
// verification; a corrupted file named, exit 1.
#include <gtest/gtest.h>

#include <string>

#include "cli/tiny_run.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 60;

TEST(CkptInspectCli, ListsTheTensorsAndVerifiesTheChecksums) {
  const TinyRun run = train_tiny_run("inspect", 2);
  ASSERT_EQ(run.result.exit_code, 0) << run.result.all();
  const CliResult r =
      run_cli({LATTICE_EXECUTABLE, "ckpt", "inspect", run.final_dir.string()}, kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("step        2\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("status      valid (manifest, sizes and checksums verified)"),
            std::string::npos)
      << r.out;
  // gpt2-tiny's 28 parameters (120576 elements), each with AdamW's two moments.
  EXPECT_NE(r.out.find("tensors     84 (361728 elements)"), std::string::npos) << r.out;
  for (const std::string name : {"transformer.wte.weight ", "transformer.wte.weight.exp_avg ",
                                 "transformer.wte.weight.exp_avg_sq "}) {
    const size_t at = r.out.find("  " + name);
    ASSERT_NE(at, std::string::npos) << name << "\n" << r.out;
    EXPECT_NE(r.out.substr(at, r.out.find('\n', at) - at).find("f32 [256, 64]"), std::string::npos)
        << r.out;
  }
  EXPECT_NE(r.out.find("  transformer.h.1.mlp.c_fc.weight "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  rank_00000.safetensors "), std::string::npos) << r.out;
}

TEST(CkptInspectCli, CorruptedFileIsNamedAndExitsOne) {
  const TinyRun run = train_tiny_run("inspect_corrupt", 1);
  ASSERT_EQ(run.result.exit_code, 0) << run.result.all();
  const std::filesystem::path shard = corrupt_a_tensor_file(run.final_dir);
  ASSERT_FALSE(shard.empty()) << "no .safetensors in " << run.final_dir;
  const CliResult r =
      run_cli({LATTICE_EXECUTABLE, "ckpt", "inspect", run.final_dir.string()}, kLimitS);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_NE(r.out.find("status      INVALID"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(shard.filename().string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fails its checksum"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("HINT: the checkpoint is damaged"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("does not verify"), std::string::npos) << r.err;
}

TEST(CkptInspectCli, MissingDirectoryIsRefused) {
  const std::string missing = (scratch_dir("inspect_missing") / "step_7").string();
  const CliResult r = run_cli({LATTICE_EXECUTABLE, "ckpt", "inspect", missing}, kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Directory does not exist"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lattice::testing
