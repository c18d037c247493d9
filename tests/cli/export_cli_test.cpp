// `lattice export` through the executable: the Hugging Face directory it writes is what
// `lattice train --init-from` loads back, to the same validation loss; bad checkpoints refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/tiny_run.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 60;

// One step at learning rate 0 (the weights stay as loaded), validated after it.
std::vector<std::string> frozen_step(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--set",      "train.steps=1", "--set",
                                   "optim.lr=0", "--set",         "optim.min_lr=0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(ExportCli, WritesAHuggingFaceDirectoryThatTrainInitsFromToTheSameValidationLoss) {
  const TinyRun run = train_tiny_run("export_round_trip", 2);
  ASSERT_EQ(run.result.exit_code, 0) << run.result.all();
  const std::vector<double> trained = metric_values(run.metrics, "val_loss");
  ASSERT_EQ(trained.size(), 1u) << read_text(run.metrics);

  const auto hf = scratch_dir("export_round_trip_hf");
  const CliResult r = run_cli(
      {LATTICE_EXECUTABLE, "export", "--ckpt", run.final_dir.string(), "--out", hf.string()},
      kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("exported gpt2-tiny (gpt2)"), std::string::npos) << r.out;
  ASSERT_TRUE(std::filesystem::exists(hf / "model.safetensors"));
  const nlohmann::json config = nlohmann::json::parse(read_text(hf / "config.json"));
  EXPECT_EQ(config.at("model_type"), "gpt2");
  EXPECT_EQ(config.at("n_layer"), 2);
  EXPECT_EQ(config.at("n_embd"), 64);
  EXPECT_EQ(config.at("vocab_size"), 256);

  // The exported weights, frozen for one step, validate as the trained model did; a run from
  // the seed's initialisation does not (so the weights did come from the export).
  const auto frozen = run.out / "frozen.jsonl";
  const CliResult loaded =
      run_cli(train_args(run.config, "",
                         frozen_step({"--init-from", hf.string(), "--metrics", frozen.string()})),
              kLimitS);
  ASSERT_EQ(loaded.exit_code, 0) << loaded.all();
  EXPECT_NE(loaded.out.find("initialised from " + hf.string()), std::string::npos) << loaded.out;
  const std::vector<double> reloaded = metric_values(frozen, "val_loss");
  ASSERT_EQ(reloaded.size(), 1u) << read_text(frozen);
  EXPECT_NEAR(reloaded[0], trained[0], 1e-5 * trained[0]);

  const auto fresh = run.out / "fresh.jsonl";
  const CliResult untrained =
      run_cli(train_args(run.config, "", frozen_step({"--metrics", fresh.string()})), kLimitS);
  ASSERT_EQ(untrained.exit_code, 0) << untrained.all();
  const std::vector<double> initial = metric_values(fresh, "val_loss");
  ASSERT_EQ(initial.size(), 1u) << read_text(fresh);
  EXPECT_GT(std::abs(initial[0] - trained[0]), 1e-3) << initial[0] << " vs " << trained[0];
}

TEST(ExportCli, MissingCheckpointIsNamed) {
  const auto dir = scratch_dir("export_missing");
  const std::string missing = (dir / "no_such_run" / "final").string();
  const CliResult r = run_cli(
      {LATTICE_EXECUTABLE, "export", "--ckpt", missing, "--out", (dir / "hf").string()}, kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("--ckpt: Directory does not exist: " + missing), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "hf" / "model.safetensors"));
}

TEST(ExportCli, CorruptedCheckpointIsRefusedNamingTheFile) {
  const TinyRun run = train_tiny_run("export_corrupt", 1);
  ASSERT_EQ(run.result.exit_code, 0) << run.result.all();
  const std::filesystem::path shard = corrupt_a_tensor_file(run.final_dir);
  ASSERT_FALSE(shard.empty()) << "no .safetensors in " << run.final_dir;
  const auto hf = scratch_dir("export_corrupt_hf");
  const CliResult r = run_cli(
      {LATTICE_EXECUTABLE, "export", "--ckpt", run.final_dir.string(), "--out", hf.string()},
      kLimitS);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_NE(r.err.find(shard.filename().string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fails its checksum"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HINT: the checkpoint is damaged; resume from an older one"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(hf / "model.safetensors"));
}

}  // namespace
}  // namespace lattice::testing
