// Checkpoints across pipeline, tensor and data parallelism and ZeRO stages: the issue's reshard
// matrix.
//
// A run of layout A (a 4-layer model, so pp 2 with two chunks per stage fits) trains 3 steps,
// every rank saves what it owns (save_trainer_checkpoint over the world group: a stage writes
// the parameters of its ModelPart, the last stage never its copy of the tied token table), and
// trains 3 more: the uninterrupted run. A run of layout B loads the checkpoint (each rank reads
// what its part holds; a tied copy reads the token table's boxes) and trains 3 steps. Checked:
// (a) every parameter and both moments gathered from B right after the load equal A's at the
// save bit for bit, and the tied copy equals the table it copies (values and moments); (b) B's
// 3 losses equal A's last 3 within 1e-5 relative, and when B = A the losses and the final
// parameters and moments are bitwise A's (exact resume); (c) the manifest records the layout,
// and no file of a last-stage rank holds the tied table.
#include <gtest/gtest.h>

#include "../train/equivalence_config.h"
#include "../train/test_corpus.h"
#include "ckpt/checkpoint.h"
#include "ckpt/trainer_checkpoint.h"
#include "support/scratch_dir.h"
#include "trainer_layouts.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;
using testing::GlobalState;
using testing::TrainerLayout;

constexpr int kSteps = 3;

ModelConfig four_layers(const std::string& preset) {
  ModelConfig c = model_preset(preset);
  c.n_layer = 4;  // p·v = 4 chunks at pp 2, v 2
  c.seq_len = 12;
  return c;
}

TrainConfig train_config(const std::string& preset, const fs::path& data) {
  // 16 sequences: 4 micro-batches × dp {1, 2, 4}.
  return testing::equivalence_config(four_layers(preset), data,
                                     {.global_batch = 16, .micro_batches = 4, .steps = 2 * kSteps});
}

struct LayoutRun {
  std::vector<double> losses;  // of the kSteps steps trained after the save or the load
  GlobalState state;           // at the save, or right after the load
  GlobalState tied;            // the last stage's tied copies at the same point
  GlobalState final_state;     // after those steps
  fs::path checkpoint;
};

// Trains `layout`. With `load`, resumes from it first; with `save_root`, trains kSteps and saves
// before the kSteps steps whose losses are recorded.
LayoutRun run_layout(const TrainConfig& config, const TrainerLayout& layout, const fs::path& load,
                     const fs::path& save_root) {
  LayoutRun run;
  std::mutex mutex;
  run_ranks(layout.world_size(), [&](Communicator& world) {
    DeviceMesh mesh(world, layout.shape());
    Arena arena(fmt::format("rank{}", world.rank()));
    Trainer trainer(config, arena, layout.setup(mesh));
    if (!load.empty()) {
      const TrainingState state = load_trainer_checkpoint(load, trainer);
      EXPECT_EQ(state.step, kSteps);
      EXPECT_EQ(trainer.step(), kSteps);
    }
    if (!save_root.empty()) {
      for (int s = 0; s < kSteps; ++s) trainer.train_step();
      const fs::path dir = save_trainer_checkpoint(save_root, trainer, &world);
      std::lock_guard lock(mutex);
      run.checkpoint = dir;
    }
    {
      std::lock_guard lock(mutex);
      testing::contribute(trainer, run.state, &run.tied);
    }
    std::vector<double> losses;
    for (int s = 0; s < kSteps; ++s) losses.push_back(trainer.train_step().loss);
    std::lock_guard lock(mutex);
    testing::contribute(trainer, run.final_state);
    if (world.rank() == 0) run.losses = losses;
  });
  return run;
}

fs::path corpus_dir() {
  static const fs::path dir = [] {
    return testing::make_corpus_dir(fmt::format("ckpt_pp_{}", ::getpid()));
  }();
  return dir;
}

// The saving runs, one per (model, layout), shared by the cases loading from them.
const LayoutRun& saved_run(const std::string& preset, const TrainerLayout& layout) {
  static std::map<std::string, LayoutRun> runs;
  const std::string key = preset + "_" + layout.name();
  auto it = runs.find(key);
  if (it == runs.end()) {
    it = runs.emplace(key, run_layout(train_config(preset, corpus_dir()), layout, {},
                                      testing::scratch_dir("pp_" + key)))
             .first;
  }
  return it->second;
}

// (c): the layout is recorded, every tensor of the model is there, and the tied token table
// comes from first-stage ranks only.
void expect_manifest_of(const Manifest& manifest, const ModelConfig& model,
                        const TrainerLayout& layout) {
  EXPECT_EQ(manifest.layout,
            (CheckpointLayout{layout.dp, layout.tp, layout.pp, layout.v, layout.zero}));
  const ParameterRegistry whole(model);
  EXPECT_EQ(manifest.tensors.size(), 3 * whole.specs().size());
  for (const ParameterSpec& spec : whole.specs()) {
    for (const std::string& name : {spec.name, spec.name + ".exp_avg", spec.name + ".exp_avg_sq"}) {
      const TensorRecord* t = manifest.find(name);
      ASSERT_NE(t, nullptr) << name;
      if (!model.tied_embeddings || spec.name != "transformer.wte.weight") continue;
      for (const ShardRecord& s : t->shards) {
        EXPECT_EQ(mesh_coordinates(layout.shape(), testing::world_rank_of(s.file)).pp, 0)
            << name << " (the tied table) written by " << s.file << ", not on the first stage";
      }
    }
  }
}

struct Case {
  const char* preset;
  TrainerLayout from;
  TrainerLayout to;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.preset << " " << c.from.name() << " -> " << c.to.name();
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name =
      fmt::format("{}_{}_to_{}", info.param.preset, info.param.from.name(), info.param.to.name());
  for (char& ch : name) {
    if (ch == '-') ch = '_';
  }
  return name;
}

class PipelineReshard : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineReshard, LoadsBitwiseAndContinuesWithinTolerance) {
  const Case c = GetParam();
  const LayoutRun& saved = saved_run(c.preset, c.from);
  ASSERT_FALSE(saved.checkpoint.empty());
  const TrainConfig config = train_config(c.preset, corpus_dir());
  expect_manifest_of(CheckpointReader(saved.checkpoint).manifest(), config.model, c.from);
  testing::expect_tied_copies_equal_the_table(saved.state, saved.tied, "at the save");

  const LayoutRun resumed = run_layout(config, c.to, saved.checkpoint, {});
  testing::expect_same_state(resumed.state, saved.state, "after the load");  // (a)
  testing::expect_tied_copies_equal_the_table(resumed.state, resumed.tied, "after the load");

  ASSERT_EQ(resumed.losses.size(), saved.losses.size());  // (b)
  for (size_t s = 0; s < saved.losses.size(); ++s) {
    if (c.to == c.from) {
      EXPECT_EQ(resumed.losses[s], saved.losses[s]) << "step " << kSteps + int(s) + 1;
    } else {
      EXPECT_NEAR(resumed.losses[s], saved.losses[s], 1e-5 * saved.losses[s])
          << "step " << kSteps + int(s) + 1;
    }
  }
  if (c.to == c.from) {
    testing::expect_same_state(resumed.final_state, saved.final_state, "after 3 more steps");
  }
}

constexpr TrainerLayout kDp2Tp2{.dp = 2, .tp = 2};

INSTANTIATE_TEST_SUITE_P(
    IssueMatrix, PipelineReshard,
    ::testing::Values(
        // The issue's matrix: saved at (dp 2, tp 2, pp 1).
        Case{"gpt2-tiny", kDp2Tp2, {.pp = 2}}, Case{"gpt2-tiny", kDp2Tp2, {.dp = 4}},
        Case{"gpt2-tiny", kDp2Tp2, {.tp = 2, .pp = 2}},
        // ZeRO stages changed: 0 -> 1 and 1 -> 0, also across pp.
        Case{"gpt2-tiny", kDp2Tp2, {.dp = 2, .tp = 2, .zero = 1}},
        Case{"gpt2-tiny", kDp2Tp2, {.dp = 4, .zero = 1}},
        Case{"gpt2-tiny", {.dp = 2, .tp = 2, .zero = 1}, {.dp = 4}},
        Case{"gpt2-tiny", {.dp = 2, .tp = 2, .zero = 1}, {.dp = 2, .pp = 2, .zero = 1}},
        // Interleaved stages back to one rank and to another pipeline.
        Case{"gpt2-tiny", {.pp = 2, .v = 2}, {}},
        Case{"gpt2-tiny", {.pp = 2, .v = 2}, {.tp = 2, .pp = 2, .sp = true}},
        // A 3D run with ZeRO-1 (the tied copy's moments sharded over the last stage's dp group).
        Case{"gpt2-tiny", {.dp = 2, .tp = 2, .pp = 2, .zero = 1}, {.pp = 4}},
        // An untied head (llama): lm_head lives on the last stage only.
        Case{"llama-tiny", {.dp = 2, .pp = 2, .zero = 1}, {.tp = 2}},
        // Exact resume under pp, same layout: bitwise losses and final state.
        Case{"gpt2-tiny", {.pp = 2, .v = 2}, {.pp = 2, .v = 2}},
        Case{"gpt2-tiny",
             {.dp = 2, .tp = 2, .pp = 2, .zero = 1},
             {.dp = 2, .tp = 2, .pp = 2, .zero = 1}},
        Case{"llama-tiny", {.dp = 2, .pp = 2, .zero = 1}, {.dp = 2, .pp = 2, .zero = 1}}),
    case_name);

// ZeRO-2 keeps ZeRO-1's state layout (the optimizer shard [shard_begin, shard_end) of the flat
// store); ZeRO-3 holds the master weights of that shard only, which the checkpoint writes and
// reads like the moments (flat_range_shards, load_training_checkpoint).
INSTANTIATE_TEST_SUITE_P(
    ZeroTwoThree, PipelineReshard,
    ::testing::Values(
        Case{"gpt2-tiny", kDp2Tp2, {.dp = 2, .tp = 2, .zero = 2}},
        Case{"gpt2-tiny", {.dp = 2, .zero = 2}, {.dp = 2, .zero = 1}},
        Case{"gpt2-tiny", {.dp = 2, .zero = 2}, {.dp = 2, .zero = 2}},
        Case{"gpt2-tiny", kDp2Tp2, {.dp = 4, .zero = 3}},
        Case{"gpt2-tiny", {.dp = 2, .tp = 2, .zero = 3}, {.pp = 2, .v = 2}},
        Case{"llama-tiny", {.dp = 2, .tp = 2, .zero = 3}, {.dp = 2, .tp = 2, .zero = 3}}),
    case_name);

// The run a pipeline checkpoint came from, gathered into one process for `lattice export` and
// `lattice sample`: the whole model reads every tensor from the stage that wrote it.
TEST(PipelineCheckpoint, LoadsIntoAWholeModelForExport) {
  const LayoutRun& saved = saved_run("gpt2-tiny", {.pp = 2, .v = 2});
  Arena arena("export");
  CheckpointInfo info;
  std::unique_ptr<Transformer> model = load_checkpoint_model(saved.checkpoint, arena, &info);
  EXPECT_EQ(info.step, kSteps);
  for (int i = 0; i < int(model->registry().specs().size()); ++i) {
    const ParameterSpec& spec = model->registry().at(i);
    const std::vector<float>& want = saved.state.at(spec.name);
    EXPECT_EQ(std::memcmp(model->parameters().master(i).raw_data(), want.data(),
                          want.size() * sizeof(float)),
              0)
        << spec.name;
  }
}

// The final checkpoint of a pipeline run (a directory of its own, `output.dir/final`).
TEST(PipelineCheckpoint, AFinalDirectoryOfAThreeDimensionalRunHoldsEveryTensorOnce) {
  const TrainConfig config = train_config("gpt2-tiny", corpus_dir());
  const TrainerLayout layout{.dp = 2, .tp = 2, .pp = 2, .zero = 1};
  const fs::path dir = testing::scratch_dir("pp_final") / "final";
  GlobalState state;
  std::mutex mutex;
  run_ranks(layout.world_size(), [&](Communicator& world) {
    DeviceMesh mesh(world, layout.shape());
    Arena arena("rank");
    Trainer trainer(config, arena, layout.setup(mesh));
    trainer.train_step();
    save_trainer_checkpoint(CheckpointTarget::directory(dir), trainer, &world);
    std::lock_guard lock(mutex);
    testing::contribute(trainer, state);
  });
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
  const CheckpointReader reader(dir);  // verifies: every tensor covered exactly once
  expect_manifest_of(reader.manifest(), config.model, layout);
  Arena arena("load");
  std::unique_ptr<Transformer> model = load_checkpoint_model(dir, arena);
  for (int i = 0; i < int(model->registry().specs().size()); ++i) {
    const ParameterSpec& spec = model->registry().at(i);
    const std::vector<float>& want = state.at(spec.name);
    EXPECT_EQ(std::memcmp(model->parameters().master(i).raw_data(), want.data(),
                          want.size() * sizeof(float)),
              0)
        << spec.name;
  }
}

// Saving with a group that is not the whole run names the mismatch.
TEST(PipelineCheckpoint, AWorldGroupOfTheWrongSizeIsRefused) {
  const TrainConfig config = train_config("gpt2-tiny", corpus_dir());
  const TrainerLayout layout{.pp = 2};
  const fs::path root = testing::scratch_dir("pp_wrong_group");
  run_ranks(layout.world_size(), [&](Communicator& world) {
    DeviceMesh mesh(world, layout.shape());
    Arena arena("rank");
    Trainer trainer(config, arena, layout.setup(mesh));
    try {
      save_trainer_checkpoint(root, trainer, &mesh.tp());  // a group of one, not the world
      ADD_FAILURE() << "saved with the tp group of one rank";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("pp 2"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace lattice
