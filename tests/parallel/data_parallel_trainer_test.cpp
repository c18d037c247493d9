// Data parallelism end to end (DESIGN.md invariant 1): any dp × micro-batch × zero layout of the
// same global batch reproduces the single-rank run within reassociation tolerance, the same
// layout twice is bitwise identical, clipping acts on the global norm, the replicas stay equal
// (the replica check runs after every step), and the arena's bytes per category are exactly
// the documented formulas (docs/data-parallel.md), so ZeRO-1 really shrinks the optimizer state.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>

#include "../train/test_corpus.h"
#include "comm/thread_world.h"
#include "train/trainer.h"

namespace lattice {
namespace {

constexpr int64_t kGlobalBatch = 16;  // divisible by dp × micro-batches up to 4 × 4
constexpr int kSteps = 10;            // the 10 steps per equivalence run
// Losses agree within 1e-5 relative (the bound). Parameters after kSteps AdamW steps at
// lr 3e-3 within 1e-2·lr: AdamW's m/√v normalises each element, so the reassociation error of a
// near-zero gradient becomes a step of up to ~lr in a different direction (measured over 10
// steps: 1.6e-5).
constexpr double kParamTolerance = 3e-5;

TrainConfig small_config(const std::string& preset, const std::filesystem::path& data) {
  TrainConfig c;
  c.model = model_preset(preset);
  c.model.seq_len = 16;
  c.data_dir = data.string();
  c.data_mode = SamplingMode::kShuffled;
  c.seq_len = 16;
  c.global_batch = kGlobalBatch;
  c.lr = 3e-3f;
  c.min_lr = 3e-4f;
  c.warmup_steps = 1;
  c.steps = c.decay_steps = kSteps;
  c.adam.lr = c.lr;
  c.threads = 1;
  c.eval_batches = 2;
  return c;
}

using CategoryBytes = std::array<size_t, kMemoryCategoryCount>;

struct RunResult {
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::vector<float> params;              // the master weights after the last step (gathered)
  std::vector<CategoryBytes> live_bytes;  // [dp rank]: its arena's live bytes by category
  std::vector<CategoryBytes> peak_bytes;  // [dp rank]: its arena's peak bytes by category
  // [dp rank]: the most gradient-bucket bytes lent at once (ZeRO-2/3) and gathered parameter
  // elements held at once (ZeRO-3).
  std::vector<int64_t> peak_lent_bucket_bytes, peak_gathered_elements;
};

RunResult train(TrainConfig config, int dp, int64_t micro_batches, int zero = 0) {
  config.micro_batches = micro_batches;
  config.micro_batch = 0;  // derived: global / (micro_batches × dp)
  RunResult run;
  run.live_bytes.resize(size_t(dp));
  run.peak_bytes.resize(size_t(dp));
  run.peak_lent_bucket_bytes.resize(size_t(dp));
  run.peak_gathered_elements.resize(size_t(dp));
  std::mutex mutex;
  run_ranks(dp, [&](Communicator& comm) {
    Arena arena(fmt::format("rank{}", comm.rank()));
    ParallelSetup setup{
        .dp = &comm, .zero = zero, .bucket_bytes = 16 << 10, .check_replicas = true, .threads = 1};
    Trainer trainer(config, arena, setup);
    std::vector<double> losses, norms;
    for (int64_t s = 0; s < config.steps; ++s) {
      StepMetrics m = trainer.train_step();
      losses.push_back(m.loss);
      norms.push_back(m.grad_norm);
    }
    std::lock_guard lock(mutex);
    const size_t rank = size_t(comm.rank());
    run.live_bytes[rank] = arena.stats().live_by_category;
    run.peak_bytes[rank] = arena.stats().peak_by_category;
    // Each rank contributes the master elements it holds: all of them, or its ZeRO-3 shard.
    ParameterStore& store = trainer.model().parameters();
    const FlatRange held = store.master_range();
    run.params.resize(size_t(trainer.model().registry().total_elements()));
    std::copy(store.master().data<float>(), store.master().data<float>() + held.size(),
              run.params.begin() + held.begin);
    const GradientSyncStats sync = trainer.gradient_sync_stats();
    if (zero >= 2 && dp > 1) {
      run.peak_lent_bucket_bytes[rank] = int64_t(sync.peak_lent) * sync.largest_bucket_elements * 4;
      EXPECT_GT(sync.peak_lent, 0);
      // Lending waits for the buckets in flight: never the whole model at once.
      EXPECT_LE(sync.peak_lent, sync.lent_bound);
    }
    if (zero == 3 && dp > 1) run.peak_gathered_elements[rank] = sync.peak_gathered_elements;
    if (comm.rank() == 0) {
      run.losses = losses;
      run.grad_norms = norms;
      if (zero < 2 && dp > 1) {
        // Every bucket was launched during backward (the hook reported every parameter).
        EXPECT_EQ(sync.launched_during_backward, sync.buckets);
        EXPECT_GT(sync.buckets, 1);
      }
    }
  });
  return run;
}

void expect_close(const RunResult& a, const RunResult& b, double loss_rtol, double param_atol) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_NEAR(a.losses[i], b.losses[i], loss_rtol * std::abs(a.losses[i])) << "step " << i;
    EXPECT_NEAR(a.grad_norms[i], b.grad_norms[i], 1e-4 * a.grad_norms[i]) << "step " << i;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.params.size(); ++i) {
    worst = std::max(worst, double(std::abs(a.params[i] - b.params[i])));
  }
  EXPECT_LE(worst, param_atol);
}

struct Layout {
  const char* preset;
  int dp;
  int64_t micro_batches;
  int zero;
};

void PrintTo(const Layout& l, std::ostream* os) {
  *os << l.preset << " dp" << l.dp << " mb" << l.micro_batches << " zero" << l.zero;
}

class DataParallelEquivalence : public ::testing::TestWithParam<Layout> {};

TEST_P(DataParallelEquivalence, MatchesTheSingleRankRunWithTheSameGlobalBatch) {
  const Layout l = GetParam();
  // A directory per test: ctest runs the cases side by side.
  auto dir =
      testing::make_corpus_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  const TrainConfig config = small_config(l.preset, dir);
  const RunResult single = train(config, 1, 1);
  const RunResult layout = train(config, l.dp, l.micro_batches, l.zero);
  expect_close(single, layout, 1e-5, kParamTolerance);
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& info) {
  std::string preset = info.param.preset;
  for (char& ch : preset) {
    if (ch == '-') ch = '_';
  }
  return fmt::format("{}_dp{}_mb{}_zero{}", preset, info.param.dp, info.param.micro_batches,
                     info.param.zero);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DataParallelEquivalence,
    ::testing::Values(
        Layout{"gpt2-tiny", 1, 4, 0}, Layout{"gpt2-tiny", 2, 1, 0}, Layout{"gpt2-tiny", 2, 4, 0},
        Layout{"gpt2-tiny", 4, 1, 0}, Layout{"gpt2-tiny", 4, 4, 0}, Layout{"llama-tiny", 1, 4, 0},
        Layout{"llama-tiny", 2, 1, 0}, Layout{"llama-tiny", 2, 4, 0}, Layout{"llama-tiny", 4, 1, 0},
        Layout{"llama-tiny", 4, 4, 0}, Layout{"gpt2-tiny", 2, 1, 1}, Layout{"gpt2-tiny", 4, 4, 1},
        Layout{"llama-tiny", 2, 4, 1}, Layout{"llama-tiny", 4, 1, 1}, Layout{"gpt2-tiny", 1, 4, 2},
        Layout{"gpt2-tiny", 2, 1, 2}, Layout{"gpt2-tiny", 2, 4, 2}, Layout{"gpt2-tiny", 4, 1, 2},
        Layout{"gpt2-tiny", 4, 4, 2}, Layout{"llama-tiny", 2, 1, 2}, Layout{"llama-tiny", 4, 4, 2},
        Layout{"gpt2-tiny", 1, 4, 3}, Layout{"gpt2-tiny", 2, 1, 3}, Layout{"gpt2-tiny", 2, 4, 3},
        Layout{"gpt2-tiny", 4, 1, 3}, Layout{"gpt2-tiny", 4, 4, 3}, Layout{"llama-tiny", 2, 1, 3},
        Layout{"llama-tiny", 2, 4, 3}, Layout{"llama-tiny", 4, 1, 3},
        Layout{"llama-tiny", 4, 4, 3}),
    layout_name);

TEST(DataParallel, SameLayoutTwiceIsBitwiseIdentical) {
  auto dir = testing::make_corpus_dir("dp_bitwise");
  const TrainConfig config = small_config("gpt2-tiny", dir);
  for (int zero : {0, 1, 2, 3}) {
    const RunResult a = train(config, 4, 2, zero);
    const RunResult b = train(config, 4, 2, zero);
    for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << i;
    ASSERT_EQ(a.params.size(), b.params.size());
    EXPECT_EQ(std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)), 0)
        << "zero " << zero;
  }
}

// With grad_clip far below the norm every step is clipped; the clipped update must use the
// global norm (a per-rank norm would scale each replica differently and fail the replica check,
// and would not match the single-rank update).
TEST(DataParallel, ClippedUpdateEqualsTheSingleRankOne) {
  auto dir = testing::make_corpus_dir("dp_clip");
  TrainConfig config = small_config("llama-tiny", dir);
  config.grad_clip = 0.05f;
  const RunResult single = train(config, 1, 1);
  for (double norm : single.grad_norms) ASSERT_GT(norm, 0.05) << "clipping must be active";
  expect_close(single, train(config, 2, 2, 0), 1e-5, kParamTolerance);
  expect_close(single, train(config, 4, 1, 1), 1e-5, kParamTolerance);
  expect_close(single, train(config, 2, 2, 2), 1e-5, kParamTolerance);
  expect_close(single, train(config, 4, 1, 3), 1e-5, kParamTolerance);
}

// Ψ: the padded parameter count, every parameter's flat slot rounded up to 16 elements (64
// bytes), so that every parameter and every ZeRO shard starts 64-byte aligned.
int64_t padded_parameter_count(const ModelConfig& model) {
  const ParameterRegistry registry(model);
  int64_t psi = 0;
  for (const ParameterSpec& spec : registry.specs()) {
    psi += (spec.local_shape.numel() + 15) / 16 * 16;
  }
  EXPECT_EQ(psi, registry.total_elements()) << "the padding rule changed: update the docs";
  return psi;
}

// Elements of the parameters the forward reads in f32 (norms, biases, embedding tables),
// padded like the flat store: the f32 copies a bf16 ZeRO-1/2 rank keeps whole.
int64_t read_as_f32_elements(const ModelConfig& model) {
  const ParameterRegistry registry(model);
  int64_t elements = 0;
  for (const ParameterSpec& spec : registry.specs()) {
    if (spec.read_as_f32) elements += (spec.local_shape.numel() + 15) / 16 * 16;
  }
  EXPECT_GT(elements, 0);
  EXPECT_LT(elements, registry.total_elements() / 2) << "the f32 copies are the small part";
  return elements;
}

// ZeRO-3's most gathered elements: the ends' parameters and the two largest layers' (padded).
int64_t ends_and_two_layers(const ModelConfig& model) {
  const ParameterRegistry registry(model);
  std::vector<int64_t> per_layer(size_t(model.n_layer), 0);
  int64_t ends = 0;
  for (const ParameterSpec& spec : registry.specs()) {
    const int64_t padded = (spec.local_shape.numel() + 15) / 16 * 16;
    (spec.layer < 0 ? ends : per_layer[size_t(spec.layer)]) += padded;
  }
  std::sort(per_layer.rbegin(), per_layer.rend());
  return ends + per_layer[0] + (per_layer.size() > 1 ? per_layer[1] : 0);
}

// Elements of dp rank r's ZeRO-1 shard: S = ceil16(ceil(Ψ / N)) each, the last ones shorter
// (or empty) so that the shards tile [0, Ψ).
int64_t zero_shard_elements(int64_t psi, int n, int r) {
  const int64_t per_rank = ((psi + n - 1) / n + 15) / 16 * 16;
  return std::clamp(psi - r * per_rank, int64_t(0), per_rank);
}

// The arena's bytes by category on every dp rank against docs/data-parallel.md's formulas,
// exactly: live bytes count what was requested, not the 64-byte-rounded blocks. |S_r| is rank
// r's shard, ≈ Ψ/N.
//   parameters: 4Ψ (f32 master) + 2Ψ (bf16 compute copy; none under fp32) at ZeRO-0/1/2;
//               4|S_r| at ZeRO-3 between steps (the master shard only)
//   gradients:  4Ψ (f32) at ZeRO-0/1; 4|S_r| at ZeRO-2/3 between backwards
//   optimizer:  8Ψ (f32 m and v) at ZeRO-0; 8|S_r| from ZeRO-1
// and the peaks add exactly the transient buffers: the gradient buckets lent at once (ZeRO-2/3)
// and the gathered units held at once (ZeRO-3: f32 values, plus a bf16 copy under bf16).
void expect_bytes_per_category(const TrainConfig& config, int dp, int zero) {
  const int64_t psi = padded_parameter_count(config.model);
  const RunResult run = train(config, dp, 1, zero);
  ASSERT_EQ(run.live_bytes.size(), size_t(dp));
  const bool bf16 = config.compute_dtype == DType::kBF16;
  const bool sharded = dp > 1;
  int64_t optimizer_total = 0, gradient_total = 0, parameter_total = 0;
  for (int r = 0; r < dp; ++r) {
    const CategoryBytes& live = run.live_bytes[size_t(r)];
    const CategoryBytes& peak = run.peak_bytes[size_t(r)];
    const int64_t shard = zero == 0 ? psi : zero_shard_elements(psi, dp, r);
    // bf16 from ZeRO-1: the master is sharded; the compute copy and the f32 copies of what the
    // forward reads in f32 stay whole. ZeRO-3: only the master shard.
    int64_t params = 4 * psi + (bf16 ? 2 * psi : 0);
    if (sharded && zero >= 3) params = 4 * shard;
    if (sharded && bf16 && zero >= 1 && zero <= 2) {
      params = 2 * psi + 4 * read_as_f32_elements(config.model) + 4 * shard;
    }
    const int64_t grads = zero >= 2 && sharded ? 4 * shard : 4 * psi;
    const std::string where = fmt::format("Ψ {} dp {} zero {} rank {} {}", psi, dp, zero, r,
                                          dtype_name(config.compute_dtype));
    EXPECT_EQ(int64_t(live[size_t(MemoryCategory::kParameters)]), params) << where;
    EXPECT_EQ(int64_t(live[size_t(MemoryCategory::kGradients)]), grads) << where;
    EXPECT_EQ(int64_t(live[size_t(MemoryCategory::kOptimizerState)]), 8 * shard) << where;
    const int64_t gathered = run.peak_gathered_elements[size_t(r)] * (bf16 ? 6 : 4);
    EXPECT_EQ(int64_t(peak[size_t(MemoryCategory::kParameters)]), params + gathered) << where;
    EXPECT_LE(int64_t(peak[size_t(MemoryCategory::kGradients)]),
              grads + run.peak_lent_bucket_bytes[size_t(r)])
        << where;
    if (zero >= 3 && sharded) {
      // At most the ends (embedding and head) and two layers are gathered at once.
      EXPECT_GT(run.peak_gathered_elements[size_t(r)], 0) << where;
      EXPECT_LE(run.peak_gathered_elements[size_t(r)], ends_and_two_layers(config.model)) << where;
    }
    optimizer_total += int64_t(live[size_t(MemoryCategory::kOptimizerState)]);
    gradient_total += int64_t(live[size_t(MemoryCategory::kGradients)]);
    parameter_total += int64_t(live[size_t(MemoryCategory::kParameters)]);
  }
  // What a stage shards is stored once over the group: the memory really shrinks.
  const int64_t copies = sharded ? dp : 1;
  EXPECT_EQ(optimizer_total, 8 * psi * (zero == 0 ? copies : 1)) << "dp " << dp << " zero " << zero;
  EXPECT_EQ(gradient_total, 4 * psi * (zero >= 2 ? 1 : copies)) << "dp " << dp << " zero " << zero;
  if (zero >= 3 && sharded) {
    EXPECT_EQ(parameter_total, 4 * psi) << "dp " << dp << " zero " << zero;
  }
  if (bf16 && sharded && zero >= 1) {
    // The f32 master is stored once over the group.
    EXPECT_LT(parameter_total, int64_t(dp) * 6 * psi) << "dp " << dp << " zero " << zero;
  }
}

TEST(DataParallel, EveryZeroStageShrinksWhatItShards) {
  auto dir = testing::make_corpus_dir("dp_memory");
  TrainConfig config = small_config("gpt2-tiny", dir);
  config.steps = config.decay_steps = 2;  // the bytes are allocated at construction
  for (int dp : {1, 2, 4}) {
    for (int zero : {0, 1, 2, 3}) expect_bytes_per_category(config, dp, zero);
  }
  // One layer of d_model 48 makes Ψ an odd multiple of 16, so the ZeRO-1 shards over 2 and 4
  // ranks are uneven: the last rank's is shorter.
  config.model.d_model = 48;
  config.model.n_layer = 1;
  ASSERT_NE(padded_parameter_count(config.model) % 32, 0);
  for (int dp : {2, 4}) {
    for (int zero : {1, 2, 3}) expect_bytes_per_category(config, dp, zero);
  }
}

// Mixed precision: the bf16 compute copy adds 2Ψ to the parameters; the master weights,
// gradients and moments stay f32 (docs/data-parallel.md compares this with the ZeRO paper's 16Ψ).
TEST(DataParallel, MixedPrecisionBytesPerCategoryMatchTheFormulas) {
  auto dir = testing::make_corpus_dir("dp_memory_bf16");
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    TrainConfig config = small_config(preset, dir);
    config.compute_dtype = DType::kBF16;
    config.steps = config.decay_steps = 2;
    for (int dp : {1, 2}) {
      for (int zero : {0, 1, 2, 3}) expect_bytes_per_category(config, dp, zero);
    }
  }
}

// bf16 compute: dp follows the single-rank bf16 run within 1e-4 relative (the documented bf16
// tolerance; measured 1.4e-5 over 10 steps: the f32 gradient sums reassociate and the bf16 compute
// copy rounds the slightly different weights), and the replicas stay bitwise equal (the replica
// check runs after each step).
TEST(DataParallel, Bf16FollowsTheSingleRankBf16Run) {
  auto dir = testing::make_corpus_dir("dp_bf16");
  TrainConfig config = small_config("llama-tiny", dir);
  config.compute_dtype = DType::kBF16;
  const RunResult single = train(config, 1, 1);
  for (int zero : {0, 1, 2, 3}) {
    const RunResult layout = train(config, 2, 2, zero);
    for (size_t i = 0; i < single.losses.size(); ++i) {
      EXPECT_NEAR(single.losses[i], layout.losses[i], 1e-4 * single.losses[i])
          << "step " << i << " zero " << zero;
    }
  }
}

// A peer that stops taking part in the middle of ZeRO-2/3's overlapped reductions and gathers:
// the other rank's step fails in bounded time with the collective's timeout, naming the group,
// instead of waiting forever for a bucket or a layer that will never arrive.
TEST(DataParallel, ALostPeerUnderZeroTwoAndThreeIsATimeoutNotAHang) {
  auto dir = testing::make_corpus_dir("dp_lost_peer");
  TrainConfig config = small_config("gpt2-tiny", dir);
  config.micro_batches = 1;
  for (int zero : {2, 3}) {
    ThreadWorldOptions world;
    world.config.timeout = std::chrono::milliseconds(1500);
    std::string error;
    std::mutex mutex;
    const auto start = std::chrono::steady_clock::now();
    run_ranks(
        2,
        [&](Communicator& comm) {
          Arena arena(fmt::format("rank{}", comm.rank()));
          Trainer trainer(config, arena,
                          {.dp = &comm, .zero = zero, .bucket_bytes = 16 << 10, .threads = 1});
          trainer.train_step();
          if (comm.rank() == 1) return;  // leaves after one step
          try {
            for (int s = 0; s < 3; ++s) trainer.train_step();
          } catch (const Error& e) {
            std::lock_guard lock(mutex);
            error = e.what();
          }
        },
        world);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(error.find("timed out"), std::string::npos) << "zero " << zero << ": " << error;
    EXPECT_LT(seconds, 60.0) << "zero " << zero;
  }
}

TEST(DataParallel, UnknownZeroStageIsAClearError) {
  auto dir = testing::make_corpus_dir("dp_zero4");
  const TrainConfig config = small_config("gpt2-tiny", dir);
  try {
    train(config, 2, 1, 4);
    FAIL() << "zero 4 should be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero stage 4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lattice
