// Tensor and sequence parallelism against the single-rank run (DESIGN.md invariant 1): shards
// are slices of the global tensors bit for bit; step-1 gradients gathered from the shards equal
// the single-rank gradients; ten training steps give the same losses; the same layout twice is
// bitwise identical; a layout the model cannot take is refused before anything is allocated.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "../model/test_models.h"
#include "../train/equivalence_config.h"
#include "../train/test_corpus.h"
#include "comm/thread_world.h"
#include "core/philox.h"
#include "core/thread_budget.h"
#include "model/transformer.h"
#include "parallel/device_mesh.h"
#include "train/trainer.h"

namespace lattice {
namespace {

constexpr int64_t kSeqLen = 12;  // 8 × 12 = 96 token rows divide by 2, 3 and 4
constexpr int kSteps = 10;

ModelConfig with_seq_len(ModelConfig c) {
  c.seq_len = kSeqLen;
  return c;
}

struct Layout {
  const char* model;
  int tp;
  bool sp;
};

void PrintTo(const Layout& l, std::ostream* os) {
  *os << l.model << " tp" << l.tp << (l.sp ? " sp" : "");
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& info) {
  std::string name =
      fmt::format("{}_tp{}{}", info.param.model, info.param.tp, info.param.sp ? "_sp" : "");
  return testing::test_case_name(name);
}

const std::vector<Layout> kLayouts = {
    {"gpt2-tiny", 2, false},         {"gpt2-tiny", 2, true},
    {"gpt2-tiny", 4, false},         {"gpt2-tiny", 4, true},
    {"llama-tiny", 2, false},        {"llama-tiny", 2, true},
    {"llama-tiny", 4, false},        {"llama-tiny", 4, true},
    {"gpt2-6h", 3, false},           {"gpt2-6h", 3, true},
    {"llama-6h-kv3", 3, false},      {"llama-6h-kv3", 3, true},
    {"llama-6h-kv1-bias", 3, false}, {"llama-6h-kv1-bias", 3, true},
};

// ---- shards are slices ----

class ShardsAreSlices : public ::testing::TestWithParam<Layout> {};

TEST_P(ShardsAreSlices, EveryParameterShardEqualsTheSliceOfTheSingleRankTensor) {
  const Layout l = GetParam();
  const ModelConfig config = with_seq_len(testing::test_model(l.model));
  Arena arena("shards");
  ParameterRegistry full_registry(config);
  ParameterStore full(full_registry, arena, DType::kF32);
  full.initialize(config, 1234);
  for (int rank = 0; rank < l.tp; ++rank) {
    ParameterRegistry registry(config, {l.tp, rank, l.sp});
    ASSERT_EQ(registry.specs().size(), full_registry.specs().size());
    ParameterStore shard(registry, arena, DType::kF32);
    shard.initialize(config, 1234);
    for (int i = 0; i < int(registry.specs().size()); ++i) {
      const ParameterSpec& spec = registry.at(i);
      ASSERT_EQ(spec.name, full_registry.at(i).name);
      ASSERT_EQ(spec.shape, full_registry.at(i).shape);
      const float* global = full.master(i).data<float>();
      const float* local = shard.master(i).data<float>();
      int64_t visited = 0;
      for_each_shard_run(spec.shape, spec.shard, [&](int64_t g, int64_t lo, int64_t n) {
        for (int64_t k = 0; k < n; ++k) {
          ASSERT_EQ(std::bit_cast<uint32_t>(local[lo + k]), std::bit_cast<uint32_t>(global[g + k]))
              << spec.name << " rank " << rank << " local " << lo + k;
        }
        visited += n;
      });
      // Everything that is not a slice of the global tensor is vocabulary padding, kept zero.
      const int64_t padding = spec.local_shape.numel() - visited;
      EXPECT_EQ(padding, spec.shard.padding *
                             (spec.local_shape.numel() / std::max<int64_t>(1, spec.local_shape[0])))
          << spec.name;
      if (spec.shard.padding > 0) {
        const int64_t first_pad = (spec.local_shape[0] - spec.shard.padding) * spec.local_shape[1];
        for (int64_t k = first_pad; k < spec.local_shape.numel(); ++k) ASSERT_EQ(local[k], 0.0f);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardsAreSlices, ::testing::ValuesIn(kLayouts), layout_name);

// ---- step-1 gradients ----

struct Gradients {
  double loss = 0.0;
  std::vector<std::vector<float>> grads;  // per parameter, global shape
};

Tensor random_tokens(Arena& arena, int64_t B, int64_t T, int64_t vocab, uint64_t key) {
  Tensor t = Tensor::empty(arena, {B, T}, DType::kI32);
  PhiloxStream rng(99, key);
  for (int64_t i = 0; i < B * T; ++i)
    t.data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(vocab)));
  return t;
}

// One forward and backward of a fixed batch on `tp` ranks; the gradients gathered into global
// tensors. Replicated parameters must hold the same gradient on every rank.
Gradients step_one_gradients(const ModelConfig& config, int tp, bool sp) {
  Gradients out;
  ParameterRegistry global(config);
  // Per rank and parameter: the shard's gradient placed in a global-shaped buffer.
  std::vector<std::vector<std::vector<float>>> by_rank(static_cast<size_t>(tp));
  std::vector<double> losses(static_cast<size_t>(tp));
  run_ranks(tp, [&](Communicator& comm) {
    set_thread_budget(1);
    Arena arena(fmt::format("rank{}", comm.rank()));
    Transformer model(config, arena, DType::kF32, TensorParallel(&comm, sp));
    model.initialize(7);
    Tensor tokens = random_tokens(arena, 8, kSeqLen, config.vocab_size, 1);
    Tensor targets = random_tokens(arena, 8, kSeqLen, config.vocab_size, 2);
    model.parameters().zero_grads();
    ForwardResult r = model.forward(tokens, targets);
    model.backward(float(1.0 / double(r.token_count)));
    model.reduce_partial_grads();
    losses[size_t(comm.rank())] = r.loss_sum / double(r.token_count);
    auto& mine = by_rank[size_t(comm.rank())];
    const ParameterRegistry& registry = model.registry();
    for (int i = 0; i < int(registry.specs().size()); ++i) {
      const ParameterSpec& spec = registry.at(i);
      const float* local = model.parameters().grad(i).data<float>();
      std::vector<float> g(size_t(spec.shape.numel()), 0.0f);
      for_each_shard_run(spec.shape, spec.shard, [&](int64_t gi, int64_t li, int64_t n) {
        std::copy(local + li, local + li + n, g.begin() + gi);
      });
      mine.push_back(std::move(g));
    }
  });
  out.loss = losses[0];
  for (int i = 0; i < int(global.specs().size()); ++i) {
    const ParameterSpec& spec = global.at(i);
    ParameterRegistry rank0(config, {tp, 0, sp});
    std::vector<float> g(size_t(spec.shape.numel()), 0.0f);
    for (int r = 0; r < tp; ++r) {
      EXPECT_EQ(losses[size_t(r)], losses[0]) << "loss differs on rank " << r;
      const std::vector<float>& part = by_rank[size_t(r)][size_t(i)];
      if (rank0.at(i).shard.replicated()) {
        // Replicated: every rank holds the whole gradient, bit for bit the same.
        EXPECT_EQ(part, by_rank[0][size_t(i)]) << spec.name << " differs on rank " << r;
        if (r == 0) g = part;
      } else {
        ParameterRegistry mine(config, {tp, r, sp});
        for_each_shard_run(spec.shape, mine.at(i).shard, [&](int64_t gi, int64_t, int64_t n) {
          std::copy(part.begin() + gi, part.begin() + gi + n, g.begin() + gi);
        });
      }
    }
    out.grads.push_back(std::move(g));
  }
  return out;
}

class TensorParallelGradients : public ::testing::TestWithParam<Layout> {};

TEST_P(TensorParallelGradients, GatheredStepOneGradientsMatchTheSingleRankRun) {
  const Layout l = GetParam();
  const ModelConfig config = with_seq_len(testing::test_model(l.model));
  const Gradients single = step_one_gradients(config, 1, false);
  const Gradients split = step_one_gradients(config, l.tp, l.sp);
  EXPECT_NEAR(split.loss, single.loss, 1e-5 * single.loss);
  ParameterRegistry registry(config);
  for (size_t i = 0; i < single.grads.size(); ++i) {
    double ref = 0.0, diff = 0.0;
    for (size_t k = 0; k < single.grads[i].size(); ++k) {
      ref = std::max(ref, double(std::abs(single.grads[i][k])));
      diff = std::max(diff, double(std::abs(single.grads[i][k] - split.grads[i][k])));
    }
    ASSERT_GT(ref, 0.0) << registry.at(int(i)).name << " has no gradient at all";
    EXPECT_LE(diff / ref, 1e-5) << registry.at(int(i)).name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelGradients, ::testing::ValuesIn(kLayouts),
                         layout_name);

// ---- ten training steps ----

TrainConfig train_config(const std::string& model, const std::filesystem::path& data) {
  return testing::equivalence_config(with_seq_len(testing::test_model(model)), data,
                                     {.seq_len = kSeqLen, .steps = kSteps});
}

struct TrainRun {
  std::vector<double> losses, norms;
  std::vector<float> rank0_params;
};

// Trains on a dp × tp mesh of in-process ranks; world rank 0's losses and parameters.
TrainRun train(const TrainConfig& config, int tp, bool sp, int dp = 1, int zero = 0) {
  TrainRun run;
  std::mutex mutex;
  run_ranks(dp * tp, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {.pp = 1, .dp = dp, .tp = tp});
    Arena arena(fmt::format("rank{}", comm.rank()));
    Trainer trainer(config, arena,
                    {.dp = &mesh.dp(),
                     .zero = zero,
                     .bucket_bytes = 8 << 10,
                     .check_replicas = dp > 1,
                     .threads = 1,
                     .tp = &mesh.tp(),
                     .sequence_parallel = sp});
    std::vector<double> losses, norms;
    for (int s = 0; s < kSteps; ++s) {
      StepMetrics m = trainer.train_step();
      losses.push_back(m.loss);
      norms.push_back(m.grad_norm);
    }
    if (comm.rank() == 0) {
      std::lock_guard lock(mutex);
      run.losses = losses;
      run.norms = norms;
      const Tensor& master = trainer.model().parameters().master();
      run.rank0_params.assign(master.data<float>(), master.data<float>() + master.numel());
    }
  });
  return run;
}

class TensorParallelTraining : public ::testing::TestWithParam<Layout> {};

TEST_P(TensorParallelTraining, TenStepsMatchTheSingleRankLosses) {
  const Layout l = GetParam();
  auto dir = testing::make_corpus_dir(
      std::string("tp_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  const TrainConfig config = train_config(l.model, dir);
  const TrainRun single = train(config, 1, false);
  const TrainRun split = train(config, l.tp, l.sp);
  ASSERT_EQ(split.losses.size(), single.losses.size());
  for (size_t s = 0; s < single.losses.size(); ++s) {
    EXPECT_NEAR(split.losses[s], single.losses[s], 1e-5 * single.losses[s]) << "step " << s + 1;
    EXPECT_NEAR(split.norms[s], single.norms[s], 1e-4 * single.norms[s]) << "step " << s + 1;
  }
  EXPECT_GT(single.norms[0], config.grad_clip) << "clipping should be active";
  EXPECT_LT(single.losses.back(), single.losses.front());
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelTraining, ::testing::ValuesIn(kLayouts),
                         layout_name);

// Data and tensor parallelism on one mesh (tp fastest), with every ZeRO stage over dp (under
// sequence parallelism ZeRO-2/3 sum the norms' partial gradients over tp on the owned shard).
TEST(TensorParallelTraining, DataTimesTensorParallelMeshMatchesTheSingleRankRun) {
  auto dir = testing::make_corpus_dir("tp_dp_mesh");
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    const TrainConfig config = train_config(model, dir);
    const TrainRun single = train(config, 1, false);
    for (int zero : {0, 1, 2, 3}) {
      const TrainRun mesh = train(config, 2, true, 2, zero);
      for (size_t s = 0; s < single.losses.size(); ++s) {
        EXPECT_NEAR(mesh.losses[s], single.losses[s], 1e-5 * single.losses[s])
            << model << " zero " << zero << " step " << s + 1;
        EXPECT_NEAR(mesh.norms[s], single.norms[s], 1e-4 * single.norms[s])
            << model << " zero " << zero << " step " << s + 1;
      }
    }
  }
}

TEST(TensorParallelTraining, SameLayoutTwiceIsBitwiseIdentical) {
  auto dir = testing::make_corpus_dir("tp_bitwise");
  const TrainConfig config = train_config("llama-tiny", dir);
  const TrainRun a = train(config, 2, true);
  const TrainRun b = train(config, 2, true);
  ASSERT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.rank0_params.size(), b.rank0_params.size());
  EXPECT_EQ(std::memcmp(a.rank0_params.data(), b.rank0_params.data(),
                        a.rank0_params.size() * sizeof(float)),
            0);
}

// ---- layouts the model cannot take ----

TEST(TensorParallelLayoutErrors, HeadsThatDoNotSplitAreRefusedWithTheFix) {
  try {
    ParameterRegistry registry(model_preset("gpt2-tiny"), {3, 0, false});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("4 attention heads"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--tp"), std::string::npos) << e.what();
  }
}

TEST(TensorParallelLayoutErrors, KvHeadsNeitherDividingNorDividedAreRefused) {
  ModelConfig c = testing::test_model("llama-6h-kv3");
  EXPECT_THROW(ParameterRegistry(c, {2, 0, false}), ConfigError);
  ModelConfig g = testing::test_model("gpt2-6h");
  g.n_kv_head =
      2;  // 6 heads share 2 kv heads; tp 3 would replicate them, which fused c_attn cannot
  EXPECT_THROW(ParameterRegistry(g, {3, 0, false}), ConfigError);
}

TEST(TensorParallelLayoutErrors, FeedForwardWidthThatDoesNotSplitIsRefused) {
  ModelConfig c = model_preset("llama-tiny");
  c.d_ff = 170;  // not divisible by 4
  EXPECT_THROW(ParameterRegistry(c, {4, 0, false}), ConfigError);
}

TEST(TensorParallelLayoutErrors, SequenceParallelRowsThatDoNotSplitAreRefusedByTheTrainer) {
  auto dir = testing::make_corpus_dir("tp_sp_rows");
  TrainConfig config = train_config("gpt2-6h", dir);
  config.seq_len = config.model.seq_len = 10;  // 4 rows × 10 = 40 tokens: not divisible by 3
  EXPECT_THROW(run_ranks(3,
                         [&](Communicator& comm) {
                           Arena arena("sp");
                           Trainer trainer(config, arena,
                                           {.threads = 1, .tp = &comm, .sequence_parallel = true});
                         }),
               ConfigError);
}

}  // namespace
}  // namespace lattice
