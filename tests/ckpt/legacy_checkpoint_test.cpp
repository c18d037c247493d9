// Directories of the earlier single-rank format (state.json, model.safetensors,
// optimizer.safetensors) still load through load_checkpoint_model and load_training_checkpoint.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "ckpt/checkpoint.h"
#include "ckpt/model_config_json.h"
#include "ckpt/safetensors.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

TEST(LegacyCheckpoint, FormatVersionOneStillLoads) {
  std::filesystem::path dir = testing::scratch_dir("legacy");
  Arena arena("test");
  TrainConfig config;
  config.model = model_preset("gpt2-tiny");
  Transformer model(config.model, arena, DType::kF32);
  model.initialize(8);
  AdamW optimizer(model.parameters(), arena, config.adam);
  Tensor& g = model.parameters().grads();
  for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = float(i % 7) * 0.01f;
  optimizer.step(1e-3f);

  // Written the way the format-1 writer did.
  const auto& specs = model.registry().specs();
  SafetensorsWriter weights, moments;
  for (int i = 0; i < int(specs.size()); ++i) {
    const ParameterSpec& spec = specs[size_t(i)];
    weights.add(spec.name, model.parameters().master(i));
    const int64_t b = spec.offset, e = b + spec.shape.numel();
    moments.add(spec.name + ".exp_avg", optimizer.m().slice_rows(b, e).view(spec.shape));
    moments.add(spec.name + ".exp_avg_sq", optimizer.v().slice_rows(b, e).view(spec.shape));
  }
  weights.write(dir / "model.safetensors");
  moments.write(dir / "optimizer.safetensors");
  nlohmann::json state = {{"format_version", 1},
                          {"step", 1},
                          {"model", model_config_to_json(config.model)},
                          {"tokenizer", "byte"},
                          {"compute_dtype", "f32"},
                          {"seed", 9}};
  std::ofstream(dir / "state.json") << state.dump(2);

  CheckpointInfo info;
  std::unique_ptr<Transformer> loaded = load_checkpoint_model(dir, arena, &info);
  EXPECT_EQ(info.step, 1);
  EXPECT_EQ(info.seed, 9u);
  const Tensor& a = loaded->parameters().master();
  EXPECT_EQ(std::memcmp(a.raw_data(), model.parameters().master().raw_data(), a.nbytes()), 0);
  AdamW restored(loaded->parameters(), arena, config.adam);
  const TrainingState loaded_state = load_training_checkpoint(dir, *loaded, restored);
  EXPECT_EQ(loaded_state.step, 1);
  EXPECT_EQ(loaded_state.lr_step, 1);
  EXPECT_EQ(loaded_state.seed, 9u);
  EXPECT_EQ(restored.steps_taken(), 1);
  EXPECT_EQ(std::memcmp(restored.v().raw_data(), optimizer.v().raw_data(), optimizer.v().nbytes()),
            0);
}

}  // namespace
}  // namespace lattice
