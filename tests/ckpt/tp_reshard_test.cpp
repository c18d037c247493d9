// Checkpoints of tensor-parallel (× dp, × ZeRO-1) runs loading into another layout.
//
// A run of layout A trains 3 steps, every rank saves what it owns (save_trainer_checkpoint over
// the world group), and it trains 3 more: the uninterrupted run. A run of layout B loads the
// checkpoint (each rank reads the intersection of its shards with the saved boxes) and trains 3
// steps. Checked: (a) every parameter and both moments, gathered from B's ranks right after the
// load, equal A's at the save bit for bit; (b) B's 3 losses equal A's last 3 within 1e-5
// relative, bitwise when B is A's layout; (c) the manifest shows who wrote what: a tensor
// replicated over tp from tp rank 0 only, over dp (ZeRO-0) from dp rank 0 only, a tp shard as
// one box per ShardSpec piece of each tp rank, and no padding.
#include <gtest/gtest.h>

#include <set>

#include <cstring>
#include <map>
#include <mutex>

#include "../model/test_models.h"
#include "../train/equivalence_config.h"
#include "../train/test_corpus.h"
#include "ckpt/checkpoint.h"
#include "ckpt/hf_format.h"
#include "ckpt/trainer_checkpoint.h"
#include "comm/thread_world.h"
#include "parallel/device_mesh.h"
#include "support/scratch_dir.h"
#include "trainer_layouts.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSeqLen = 12;  // 8 × 12 token rows divide by 2, 3 and 4
constexpr int kSteps = 3;

ModelConfig test_model(const std::string& name) {
  ModelConfig c = testing::test_model(name);
  c.seq_len = kSeqLen;
  return c;
}

TrainConfig train_config(const std::string& model, const fs::path& data) {
  return testing::equivalence_config(test_model(model), data,
                                     {.seq_len = kSeqLen, .steps = 2 * kSteps});
}

struct Layout {
  int dp = 1;
  int tp = 1;
  int zero = 0;
  bool sp = false;

  bool operator==(const Layout&) const = default;
  std::string name() const {
    return fmt::format("dp{}_tp{}_zero{}{}", dp, tp, zero, sp ? "_sp" : "");
  }
};

using testing::GlobalState;

struct LayoutRun {
  std::vector<double> losses;  // of the steps this run trained after the checkpoint
  GlobalState state;           // at the save, or right after the load
  fs::path checkpoint;
};

// Trains `layout` on dp × tp thread ranks. With `load`, resumes from it first; with `save_root`,
// trains kSteps and saves before the steps whose losses are recorded.
LayoutRun run_layout(const TrainConfig& config, const Layout& layout, const fs::path& load,
                     const fs::path& save_root) {
  LayoutRun run;
  std::mutex mutex;
  run_ranks(layout.dp * layout.tp, [&](Communicator& world) {
    DeviceMesh mesh(world, MeshShape{.pp = 1, .dp = layout.dp, .tp = layout.tp});
    Arena arena(fmt::format("rank{}", world.rank()));
    Trainer trainer(config, arena,
                    {.dp = &mesh.dp(),
                     .zero = layout.zero,
                     .threads = 1,
                     .tp = &mesh.tp(),
                     .sequence_parallel = layout.sp});
    if (!load.empty()) {
      TrainingState state = load_trainer_checkpoint(load, trainer);
      EXPECT_EQ(state.step, kSteps);
      EXPECT_EQ(trainer.step(), kSteps);
    }
    if (!save_root.empty()) {
      for (int s = 0; s < kSteps; ++s) trainer.train_step();
      fs::path dir = save_trainer_checkpoint(save_root, trainer, &world);
      std::lock_guard lock(mutex);
      run.checkpoint = dir;
    }
    {
      std::lock_guard lock(mutex);
      testing::contribute(trainer, run.state);
    }
    std::vector<double> losses;
    for (int s = 0; s < kSteps; ++s) losses.push_back(trainer.train_step().loss);
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      run.losses = losses;
    }
  });
  return run;
}

struct Case {
  const char* model;
  Layout from;
  Layout to;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " " << c.from.name() << " -> " << c.to.name();
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name =
      fmt::format("{}_{}_to_{}", info.param.model, info.param.from.name(), info.param.to.name());
  return testing::test_case_name(name);
}

// The training data of a model's runs: one directory per process (suites may run at once),
// removed at exit.
fs::path corpus_dir(const std::string& model) {
  struct Corpora {
    std::map<std::string, fs::path> dirs;
    ~Corpora() {
      std::error_code ec;
      for (const auto& [name, dir] : dirs) fs::remove_all(dir, ec);
    }
  };
  static Corpora corpora;
  auto [it, inserted] = corpora.dirs.emplace(model, fs::path());
  if (inserted)
    it->second = testing::make_corpus_dir(fmt::format("ckpt_tp_{}_{}", ::getpid(), model));
  return it->second;
}

// The saving runs, one per (model, layout), shared by the cases loading from them.
const LayoutRun& saved_run(const std::string& model, const Layout& layout) {
  static std::map<std::string, LayoutRun> runs;
  const std::string key = model + "_" + layout.name();
  auto it = runs.find(key);
  if (it == runs.end()) {
    it = runs.emplace(key, run_layout(train_config(model, corpus_dir(model)), layout, {},
                                      testing::scratch_dir("tp_" + key)))
             .first;
  }
  return it->second;
}

// (c): who wrote what, from the manifest alone.
void expect_each_element_written_by_its_owner(const Manifest& manifest, const ModelConfig& model,
                                              const Layout& layout) {
  EXPECT_EQ(manifest.layout, (CheckpointLayout{layout.dp, layout.tp, 1, 1, layout.zero}));
  std::vector<ParameterRegistry> registries;
  for (int t = 0; t < layout.tp; ++t)
    registries.emplace_back(model, TensorParallelLayout{layout.tp, t, layout.sp});
  std::set<int> writers;
  for (const ParameterSpec& spec : registries[0].specs()) {
    for (const std::string& name : {spec.name, spec.name + ".exp_avg", spec.name + ".exp_avg_sq"}) {
      const TensorRecord* t = manifest.find(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->shape, spec.shape) << name;
      for (const ShardRecord& s : t->shards) {
        const int rank = testing::world_rank_of(s.file);
        if (spec.shard.replicated()) {
          EXPECT_EQ(rank % layout.tp, 0)
              << name << " is replicated over tp but " << s.file << " holds " << s.box.to_string();
        }
      }
      // Every element written exactly once: over tp by its owner, over dp (ZeRO-0 too, whose
      // replicas split the flat store between them) by one replica.
      int64_t written = 0;
      for (const ShardRecord& s : t->shards) written += s.box.numel();
      EXPECT_EQ(written, spec.shape.numel()) << name;
      for (const ShardRecord& s : t->shards) writers.insert(testing::world_rank_of(s.file));
    }
  }
  // The write is balanced: every rank of the world wrote a part (at ZeRO-0 too).
  EXPECT_EQ(int(writers.size()), layout.dp * layout.tp);
}

class TensorParallelReshard : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelReshard, LoadsBitwiseAndContinuesWithTheSameLosses) {
  const Case c = GetParam();
  const LayoutRun& saved = saved_run(c.model, c.from);
  ASSERT_FALSE(saved.checkpoint.empty());
  const ModelConfig model = test_model(c.model);
  expect_each_element_written_by_its_owner(CheckpointReader(saved.checkpoint).manifest(), model,
                                           c.from);

  const LayoutRun resumed =
      run_layout(train_config(c.model, corpus_dir(c.model)), c.to, saved.checkpoint, {});
  testing::expect_same_state(resumed.state, saved.state, "after the load");  // (a)

  ASSERT_EQ(resumed.losses.size(), saved.losses.size());  // (b)
  for (size_t s = 0; s < saved.losses.size(); ++s) {
    if (c.to == c.from) {
      EXPECT_EQ(resumed.losses[s], saved.losses[s]) << "step " << kSteps + int(s) + 1;
    } else {
      EXPECT_NEAR(resumed.losses[s], saved.losses[s], 1e-5 * saved.losses[s])
          << "step " << kSteps + int(s) + 1;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TensorParallelReshard,
    ::testing::Values(
        Case{"gpt2-tiny", {.tp = 2}, {.tp = 1}}, Case{"gpt2-tiny", {.tp = 1}, {.tp = 4}},
        Case{"gpt2-tiny", {.tp = 2}, {.tp = 4, .sp = true}},
        Case{"gpt2-tiny", {.tp = 2}, {.tp = 2}},
        Case{"llama-tiny", {.tp = 2}, {.tp = 4}},  // tp 4 replicates the 2 kv heads
        Case{"llama-tiny", {.tp = 4}, {.tp = 1}}, Case{"llama-tiny", {.tp = 4}, {.tp = 4}},
        Case{"gpt2-6h", {.tp = 3}, {.tp = 2}},  // the tp-3 vocabulary shards carry padding
        Case{"gpt2-tiny", {.dp = 2, .zero = 1}, {.dp = 1}},
        Case{"gpt2-tiny", {.dp = 2, .zero = 1}, {.dp = 2, .zero = 0}},
        Case{"gpt2-tiny", {.dp = 2, .tp = 2, .zero = 1}, {.dp = 2, .tp = 2, .zero = 1}},
        Case{"gpt2-tiny", {.dp = 2, .tp = 2}, {.tp = 2}},
        Case{"llama-tiny", {.dp = 2, .tp = 2, .zero = 1}, {.tp = 4}}),
    case_name);

TEST(TensorParallelCheckpoint, ExportGathersFromTheCheckpointAndALiveShardIsRefused) {
  const LayoutRun& saved = saved_run("gpt2-tiny", {.tp = 2});
  Arena arena("export");
  CheckpointInfo info;
  std::unique_ptr<Transformer> model = load_checkpoint_model(saved.checkpoint, arena, &info);
  EXPECT_EQ(model->registry().tensor_parallel().size, 1);
  for (int i = 0; i < int(model->registry().specs().size()); ++i) {
    const ParameterSpec& spec = model->registry().at(i);
    const std::vector<float>& want = saved.state.at(spec.name);
    EXPECT_EQ(std::memcmp(model->parameters().master(i).raw_data(), want.data(),
                          want.size() * sizeof(float)),
              0)
        << spec.name;
  }
  const fs::path out = testing::scratch_dir("tp_export");
  export_hf(out, *model);
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));

  // A live tp shard cannot be exported alone: the error says to export the checkpoint.
  run_ranks(2, [&](Communicator& comm) {
    Arena rank_arena("rank");
    Transformer shard(model->config(), rank_arena, DType::kF32, TensorParallel(&comm, false));
    try {
      export_hf(testing::scratch_dir(fmt::format("tp_export_rank{}", comm.rank())), shard);
      ADD_FAILURE() << "exported a tp shard";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("lattice export"), std::string::npos) << e.what();
    }
  });
}

TEST(TensorParallelCheckpoint, AFinalDirectoryOfADpTpZeroRunHoldsTheGatheredWeights) {
  const TrainConfig config = train_config("llama-tiny", corpus_dir("llama-tiny"));
  const fs::path dir = testing::scratch_dir("tp_final") / "final";
  GlobalState state;
  std::mutex mutex;
  run_ranks(4, [&](Communicator& world) {
    DeviceMesh mesh(world, MeshShape{.pp = 1, .dp = 2, .tp = 2});
    Arena arena("rank");
    Trainer trainer(config, arena, {.dp = &mesh.dp(), .zero = 1, .threads = 1, .tp = &mesh.tp()});
    trainer.train_step();
    save_trainer_checkpoint(CheckpointTarget::directory(dir), trainer, &world);
    std::lock_guard lock(mutex);
    testing::contribute(trainer, state);
  });
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
  Arena arena("load");
  CheckpointInfo info;
  std::unique_ptr<Transformer> model = load_checkpoint_model(dir, arena, &info);
  EXPECT_EQ(info.step, 1);
  for (int i = 0; i < int(model->registry().specs().size()); ++i) {
    const ParameterSpec& spec = model->registry().at(i);
    const std::vector<float>& want = state.at(spec.name);
    EXPECT_EQ(std::memcmp(model->parameters().master(i).raw_data(), want.data(),
                          want.size() * sizeof(float)),
              0)
        << spec.name;
  }
}

TEST(TensorParallelCheckpoint, HuggingFaceWeightsLoadIntoTensorParallelShards) {
  const LayoutRun& saved = saved_run("gpt2-6h", {.tp = 3});
  Arena arena("import");
  std::unique_ptr<Transformer> whole = load_checkpoint_model(saved.checkpoint, arena);
  const fs::path out = testing::scratch_dir("tp_import");
  export_hf(out, *whole);
  run_ranks(3, [&](Communicator& comm) {
    Arena rank_arena("rank");
    Transformer shard(whole->config(), rank_arena, DType::kF32, TensorParallel(&comm, false));
    load_hf_weights(out / "model.safetensors", shard);
    const ParameterRegistry& registry = shard.registry();
    for (int i = 0; i < int(registry.specs().size()); ++i) {
      const ParameterSpec& spec = registry.at(i);
      const float* local = shard.parameters().master(i).data<float>();
      const std::vector<float>& global = saved.state.at(spec.name);
      int64_t visited = 0;
      for_each_shard_run(spec.shape, spec.shard, [&](int64_t g, int64_t l, int64_t n) {
        EXPECT_EQ(std::memcmp(local + l, global.data() + g, size_t(n) * sizeof(float)), 0)
            << spec.name << " rank " << comm.rank();
        visited += n;
      });
      for (int64_t k = visited; k < spec.local_shape.numel(); ++k) {
        // Padding rows (the vocabulary's) follow the pieces along dim 0 and stay zero.
        EXPECT_EQ(local[k], 0.0f) << spec.name << " padding";
      }
    }
  });
}

}  // namespace
}  // namespace lattice
