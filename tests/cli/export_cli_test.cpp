// `lattice export` through the executable: the Hugging Face directory it writes is what
// `lattice train --init-from` loads back, to the same validation loss; bad checkpoints refused.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
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

// configs/mixtral-tiny.toml, shrunk to a few seconds: a mixture-of-experts run to export.
std::vector<std::string> mixtral_args(const std::filesystem::path& data,
                                      const std::filesystem::path& out,
                                      std::vector<std::string> extra) {
  std::vector<std::string> args =
      train_args(LATTICE_SOURCE_DIR "/configs/mixtral-tiny.toml", out,
                 {"--set", "data.dir=" + data.string(), "--set", "batch.micro_batch=2", "--set",
                  "batch.seq_len=32", "--set", "train.threads=1", "--set", "eval.batches=2",
                  "--set", "optim.warmup_steps=1"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// A trained mixtral-tiny exports as transformers' MixtralForCausalLM: config.json's Mixtral
// keys, the router and every expert's w1/w2/w3 under block_sparse_moe with the checkpoint's
// values, and `train --init-from` of the directory validates as the trained model did.
TEST(ExportCli, ExportsAMixtureOfExpertsRunAsMixtralForCausalLM) {
  const auto data = make_corpus_dir("export_mixtral", 8000, 2000);
  const auto out = scratch_dir("export_mixtral_out");
  const auto metrics = out / "metrics.jsonl";
  const CliResult trained_run = run_cli(
      mixtral_args(data, out, {"--set", "train.steps=2", "--metrics", metrics.string()}), 120);
  ASSERT_EQ(trained_run.exit_code, 0) << trained_run.all();
  const std::vector<double> trained = metric_values(metrics, "val_loss");
  ASSERT_EQ(trained.size(), 1u) << read_text(metrics);

  const auto hf = scratch_dir("export_mixtral_hf");
  const CliResult r = run_cli(
      {LATTICE_EXECUTABLE, "export", "--ckpt", (out / "final").string(), "--out", hf.string()},
      kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("exported mixtral-tiny"), std::string::npos) << r.out;
  const nlohmann::json config = nlohmann::json::parse(read_text(hf / "config.json"));
  EXPECT_EQ(config.at("architectures"), nlohmann::json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(config.at("model_type"), "mixtral");
  EXPECT_EQ(config.at("num_local_experts"), 4);
  EXPECT_EQ(config.at("num_experts_per_tok"), 2);
  EXPECT_EQ(config.at("router_aux_loss_coef").get<float>(), 0.01f);
  EXPECT_EQ(config.at("output_router_logits"), false);
  EXPECT_TRUE(config.at("sliding_window").is_null());
  EXPECT_EQ(config.at("intermediate_size"), 96);
  EXPECT_EQ(config.at("hidden_size"), 64);
  EXPECT_EQ(config.at("num_hidden_layers"), 2);
  EXPECT_EQ(config.at("num_key_value_heads"), 2);
  EXPECT_EQ(config.at("lattice_router_z_loss_coef").get<float>(), 0.001f);
  EXPECT_EQ(config.at("lattice_capacity_factor").get<float>(), 0.0f);

  // Every tensor of the checkpoint's model, under its Mixtral name, with its trained value.
  Arena arena("test");
  const std::unique_ptr<Transformer> model = load_checkpoint_model(out / "final", arena);
  ASSERT_EQ(model->config().n_experts, 4);
  const SafetensorsReader file(hf / "model.safetensors");
  EXPECT_EQ(file.tensors().size(), model->registry().specs().size());
  int64_t experts = 0;
  for (int i = 0; i < int(model->registry().specs().size()); ++i) {
    const std::string& name = model->registry().at(i).name;
    ASSERT_TRUE(file.contains(name)) << name;
    if (name.find(".block_sparse_moe.") != std::string::npos) ++experts;
    const Tensor& value = model->parameters().master(i);
    const auto bytes = file.bytes(name);
    ASSERT_EQ(bytes.size(), value.nbytes()) << name;
    EXPECT_EQ(std::memcmp(bytes.data(), value.raw_data(), value.nbytes()), 0) << name;
  }
  EXPECT_EQ(experts, 2 * (1 + 4 * 3));  // per layer: the router and 4 experts' w1, w2, w3
  EXPECT_TRUE(file.contains("model.layers.1.block_sparse_moe.experts.3.w2.weight"));

  const auto frozen = out / "frozen.jsonl";
  const CliResult loaded =
      run_cli(mixtral_args(data, "",
                           frozen_step({"--init-from", hf.string(), "--metrics", frozen.string()})),
              kLimitS);
  ASSERT_EQ(loaded.exit_code, 0) << loaded.all();
  const std::vector<double> reloaded = metric_values(frozen, "val_loss");
  ASSERT_EQ(reloaded.size(), 1u) << read_text(frozen);
  EXPECT_NEAR(reloaded[0], trained[0], 1e-5 * trained[0]);
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
