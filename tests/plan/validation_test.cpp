// The planner against the code it plans for: parameters, gradients and optimizer states that
// the memory model predicts (runtime model 'lattice') equal the live bytes of a constructed
// Trainer's arena per category, up to the parameter store's 16-element alignment of every tensor
// and of a ZeRO shard, which each test accounts for exactly; after one step the activation
// buffers equal the runtime's activation model (plan/lattice_activations.h). Plus the comparison
// table's ratios, flags and layout names (plan/validation.h).
#include "plan/validation.h"

#include <gtest/gtest.h>

#include <cmath>

#include "../train/test_corpus.h"
#include "core/error.h"
#include "forecast/forecast.h"
#include "plan/activation_memory.h"
#include "plan/cluster_spec.h"
#include "plan/evaluation.h"
#include "plan/lattice_stages.h"
#include "plan/memory_model.h"
#include "plan/model_presets.h"
#include "train/layout_run.h"

namespace lattice::plan {
namespace {

constexpr int64_t kGlobalBatch = 4;

struct Case {
  const char* model;
  const char* layout;
  const char* precision;  // the trainer's compute dtype
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " " << c.layout << " " << c.precision;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name =
      fmt::format("{}_{}_{}", info.param.model, info.param.layout, info.param.precision);
  for (char& ch : name) {
    if (ch == '-' || ch == '+') ch = '_';
  }
  return name;
}

// "gpt2-odd": gpt2-tiny with widths that are not multiples of 16 (norms of 40, 100 hidden
// features, 250 vocabulary rows), so that the store's alignment padding and an uneven ZeRO shard
// occur, and without biases (LayerNorms without bias too, like configs/shakespeare-char.toml).
constexpr const char* kOddModel = "gpt2-odd";

template <typename Config>
void make_odd(Config& c, int64_t& d_model, int64_t& d_ff, int64_t& vocab, bool& bias) {
  c.name = kOddModel;
  bias = false;  // nanoGPT's bias=False: no linear and no LayerNorm biases
  d_model = 40;  // 4 heads of 10
  d_ff = 100;
  vocab = 250;
}

ModelSpec planner_model(const std::string& name) {
  if (name != kOddModel) return model_preset(name);  // the planner's preset of the trainer's
  ModelSpec spec = model_preset("gpt2-tiny");
  make_odd(spec, spec.d_model, spec.d_ff, spec.vocab_size, spec.biases);
  spec.padded_vocab_size = spec.vocab_size;  // 125 rows on each of 2 tp ranks
  return spec;
}

ModelConfig trainer_model(const std::string& name) {
  if (name != kOddModel) return lattice::model_preset(name);
  ModelConfig config = lattice::model_preset("gpt2-tiny");
  make_odd(config, config.d_model, config.d_ff, config.vocab_size, config.bias);
  return config;
}

TrainingSetup lattice_setup(const std::string& model, const Layout& layout, Precision precision) {
  TrainingSetup setup;
  setup.model = planner_model(model);
  setup.cluster = cluster_preset("dgx-h100");
  setup.devices = layout.devices();
  setup.global_batch = kGlobalBatch;
  setup.seq_len = setup.model.max_seq_len;
  setup.precision = precision;
  setup.fp32_gradients = true;
  setup.runtime = Runtime::kLattice;
  return setup;
}

size_t live(const MemoryStats& stats, MemoryCategory category) {
  return stats.live_by_category[size_t(category)];
}

// A dp × tp layout of case `c`: the planner's memory prediction, and the layout run for `steps`
// steps (no warm-up) with the same model, global batch and precision.
struct PlannedRun {
  Layout layout;
  bool bf16 = false;
  TrainingSetup setup;
  MemoryBreakdown predicted;
  LayoutRunResult run;
};

PlannedRun plan_and_run(const Case& c, const std::string& corpus_prefix, int steps) {
  PlannedRun out;
  out.layout = parse_validation_layout(c.layout);
  out.layout.micro_batch = kGlobalBatch / out.layout.dp;
  out.bf16 = std::string_view(c.precision) == "bf16";
  out.setup = lattice_setup(c.model, out.layout, out.bf16 ? Precision::kBf16 : Precision::kFp32);
  EXPECT_FALSE(check_layout(out.setup, out.layout).has_value()) << c.layout;
  out.predicted = estimate_memory(out.setup, out.layout);

  TrainConfig config;
  config.model = trainer_model(c.model);
  config.data_dir = testing::make_corpus_dir(corpus_prefix + case_name({c, 0})).string();
  config.global_batch = kGlobalBatch;
  config.micro_batches = 1;
  config.seq_len = config.model.seq_len;
  config.compute_dtype = out.bf16 ? DType::kBF16 : DType::kF32;
  out.run = run_layout(
      config,
      {.layout = runtime_layout(out.layout), .threads = 1, .warmup_steps = 0, .steps = steps});
  return out;
}

class ModelStatesMatchTheArena : public ::testing::TestWithParam<Case> {};

TEST_P(ModelStatesMatchTheArena, PredictedBytesEqualLiveBytesOfAConstructedTrainer) {
  const Case c = GetParam();
  const PlannedRun planned = plan_and_run(c, "plan_validation_", 1);
  const Layout& layout = planned.layout;
  const bool bf16 = planned.bf16;
  const TrainingSetup& setup = planned.setup;
  const MemoryBreakdown& predicted = planned.predicted;
  const LayoutRunResult& run = planned.run;

  // The planner counts exactly the local shards' elements; the store pads every tensor.
  EXPECT_DOUBLE_EQ(predicted.parameter_count, double(run.unpadded_elements));
  const int64_t padding = run.store_elements - run.unpadded_elements;
  EXPECT_GE(padding, 0);
  if (std::string_view(c.model) == kOddModel) {
    EXPECT_GT(padding, 0) << "the case meant to pad";
  }
  EXPECT_LT(padding, 16 * 64) << "at most 15 elements for each of fewer than 64 tensors";

  const double parameter_bytes = bf16 ? 4.0 + 2.0 : 4.0;  // f32 master (+ bf16 compute copy)
  // ZeRO shards over dp, or under expert parallelism over the dp / ep ranks holding the same
  // experts (none left when ep = dp).
  const int64_t sharded_over = zero_group(setup, layout, false);
  if (bf16 && layout.zero >= 1 && sharded_over > 1) {
    // The f32 master sharded like the moments (rank 0's shard: up to 16 elements over Ψ/N),
    // the bf16 copy and the f32-read parameters whole (docs/data-parallel.md).
    EXPECT_NEAR(predicted.parameters, double(live(run.constructed, MemoryCategory::kParameters)),
                4.0 * 16.0 + parameter_bytes * double(padding));
    EXPECT_LT(predicted.parameters, 5.0 * predicted.parameter_count) << "less than 6 B each";
  } else {
    EXPECT_DOUBLE_EQ(predicted.parameters,
                     double(live(run.constructed, MemoryCategory::kParameters)) -
                         parameter_bytes * double(padding));
  }
  // Gradients: the f32 buffer of the store, and under sequence parallelism the packed partial
  // gradients of the replicated parameters (unpadded).
  EXPECT_DOUBLE_EQ(predicted.gradients, double(live(run.constructed, MemoryCategory::kGradients)) -
                                            4.0 * double(padding));

  const double optimizer_live = double(live(run.constructed, MemoryCategory::kOptimizerState));
  EXPECT_DOUBLE_EQ(optimizer_live, 8.0 * double(run.optimizer_elements));  // m and v, f32
  if (layout.zero == 0 || sharded_over == 1) {
    EXPECT_EQ(run.optimizer_elements, run.store_elements);
    EXPECT_DOUBLE_EQ(predicted.optimizer_states, optimizer_live - 8.0 * double(padding));
  } else {
    // Rank 0's ZeRO shard: ceil(P / N) of the padded store, rounded up to 16 elements.
    const int64_t shard = (run.store_elements + sharded_over - 1) / sharded_over;
    EXPECT_EQ(run.optimizer_elements, (shard + 15) / 16 * 16);
    const double exact = predicted.optimizer_states + 8.0 * double(padding) / double(sharded_over);
    EXPECT_GE(optimizer_live, exact);
    EXPECT_LT(optimizer_live, exact + 8.0 * 16.0);
  }
  // Nothing else is allocated before the first step but the token batch (i32 inputs and
  // targets of one micro-batch, counted as activations); no communication buffers.
  EXPECT_EQ(live(run.constructed, MemoryCategory::kActivations),
            size_t(2 * 4 * layout.micro_batch * setup.seq_len));
  EXPECT_DOUBLE_EQ(predicted.communication_buffers, 0.0);
  EXPECT_EQ(live(run.constructed, MemoryCategory::kCommunication), 0u);

  // After a step: the activation buffers of one micro-batch (lattice_activations.h), exactly.
  const double activations = predicted.activations + predicted.recompute_working +
                             predicted.embedding_activations + predicted.logits;
  EXPECT_DOUBLE_EQ(activations,
                   double(run.finished.peak_by_category[size_t(MemoryCategory::kActivations)]));
  EXPECT_TRUE(std::isfinite(run.losses.at(0)));

  // The Megatron model (bf16 parameters, master with the optimizer) would not match bf16 runs.
  if (bf16) {
    TrainingSetup megatron = setup;
    megatron.runtime = Runtime::kMegatron;
    EXPECT_LT(estimate_memory(megatron, layout).parameters, 0.5 * predicted.parameters);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ModelStatesMatchTheArena,
    ::testing::Values(Case{"gpt2-tiny", "dp1tp1", "fp32"}, Case{"gpt2-tiny", "dp1tp1", "bf16"},
                      Case{"gpt2-tiny", "tp2", "fp32"}, Case{"gpt2-tiny", "tp2+sp", "bf16"},
                      Case{"gpt2-tiny", "dp2+zero1", "bf16"}, Case{"gpt2-tiny", "dp2", "fp32"},
                      Case{"llama-tiny", "dp1tp1", "bf16"}, Case{"llama-tiny", "tp2", "bf16"},
                      Case{"llama-tiny", "tp2+sp", "fp32"},
                      Case{"shakespeare-char", "tp2+sp", "fp32"}, Case{kOddModel, "dp1tp1", "bf16"},
                      Case{kOddModel, "tp2+sp", "fp32"}, Case{kOddModel, "dp2+zero1", "fp32"},
                      // Mixture of experts: the router replicated, the experts split over tp and
                      // spread over ep, ZeRO-1 over the ranks holding the same experts.
                      Case{"mixtral-tiny", "dp1tp1", "bf16"},
                      Case{"mixtral-tiny", "tp2+sp", "fp32"},
                      Case{"mixtral-tiny", "dp2+ep2", "fp32"},
                      Case{"mixtral-tiny", "dp4+ep2+zero1", "bf16"},
                      Case{"mixtral-tiny", "dp4+ep2+zero1", "fp32"}),
    case_name);

// ---- pipeline stages and recompute: every stage's rank against the planner's stage ----

// gpt2-tiny and llama-tiny with 4 layers (so that pp2 v2 has its 4 chunks), a global batch of 4
// in micro-batches of 1 (pipeline layouts) or one micro-batch per dp rank (the others).
struct StageCase {
  const char* model;
  const char* layout;
  const char* precision;
};

void PrintTo(const StageCase& c, std::ostream* os) {
  *os << c.model << " " << c.layout << " " << c.precision;
}

std::string stage_case_name(const ::testing::TestParamInfo<StageCase>& info) {
  std::string name =
      fmt::format("{}_{}_{}", info.param.model, info.param.layout, info.param.precision);
  for (char& ch : name) {
    if (ch == '-' || ch == '+') ch = '_';
  }
  return name;
}

constexpr int64_t kStageLayers = 4;

class StagesMatchTheArena : public ::testing::TestWithParam<StageCase> {};

TEST_P(StagesMatchTheArena, EveryStagesPredictedBytesEqualItsArena) {
  const StageCase c = GetParam();
  Layout layout = parse_validation_layout(c.layout);
  const int64_t m = layout.pp > 1 ? kGlobalBatch / layout.dp : 1;  // micro-batches of 1 sequence
  layout.micro_batch = kGlobalBatch / (layout.dp * m);
  const bool bf16 = std::string_view(c.precision) == "bf16";
  TrainingSetup setup = lattice_setup(c.model, layout, bf16 ? Precision::kBf16 : Precision::kFp32);
  setup.model.n_layers = kStageLayers;
  ASSERT_FALSE(check_layout(setup, layout).has_value()) << check_layout(setup, layout)->message;

  TrainConfig config;
  config.model = trainer_model(c.model);
  config.model.n_layer = kStageLayers;
  config.data_dir =
      testing::make_corpus_dir(std::string("plan_stages_") + stage_case_name({c, 0})).string();
  config.global_batch = kGlobalBatch;
  config.micro_batches = m;
  config.micro_batch = layout.micro_batch;
  config.seq_len = config.model.seq_len;
  config.compute_dtype = bf16 ? DType::kBF16 : DType::kF32;
  const LayoutRunResult run = run_layout(
      config, {.layout = runtime_layout(layout), .threads = 1, .warmup_steps = 0, .steps = 1});
  ASSERT_TRUE(std::isfinite(run.losses.at(0)));
  const double parameter_bytes = bf16 ? 4.0 + 2.0 : 4.0;
  double predicted_peak = 0, measured_peak = 0;
  for (int stage = 0; stage < int(layout.pp); ++stage) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    const MemoryBreakdown predicted = estimate_stage_memory(setup, layout, stage);
    const RankRun& rank = run.stage(stage);
    const int64_t padding = rank.store_elements - rank.unpadded_elements;
    ASSERT_GE(padding, 0);
    // Parameters, gradients and optimizer states of this stage's part (its layers from the
    // runtime's partition, the embedding on the first, the head or tied copy on the last).
    EXPECT_DOUBLE_EQ(predicted.parameter_count, double(rank.unpadded_elements));
    EXPECT_DOUBLE_EQ(predicted.parameters,
                     double(live(rank.constructed, MemoryCategory::kParameters)) -
                         parameter_bytes * double(padding));
    EXPECT_DOUBLE_EQ(
        predicted.gradients,
        double(live(rank.constructed, MemoryCategory::kGradients)) - 4.0 * double(padding));
    if (layout.zero == 0) {
      EXPECT_DOUBLE_EQ(
          predicted.optimizer_states,
          double(live(rank.constructed, MemoryCategory::kOptimizerState)) - 8.0 * double(padding));
    }
    // Activations: slots × the stage's slot, the scratch, the token batches, exactly; the
    // pipeline's send staging as communication buffers.
    const MemoryStats& after = rank.finished;
    EXPECT_DOUBLE_EQ(predicted.activations + predicted.recompute_working +
                         predicted.embedding_activations + predicted.logits,
                     double(after.peak_by_category[size_t(MemoryCategory::kActivations)]));
    EXPECT_DOUBLE_EQ(predicted.communication_buffers,
                     double(after.peak_by_category[size_t(MemoryCategory::kCommunication)]));
    if (layout.pp > 1) {
      EXPECT_GT(predicted.communication_buffers, 0.0);
    }
    if (layout.zero == 0) {
      EXPECT_DOUBLE_EQ(predicted.total - predicted.fragmentation +
                           (parameter_bytes + 4.0 + 8.0) * double(padding),
                       double(after.peak_bytes));
    }
    predicted_peak = std::max(predicted_peak, predicted.total);
    measured_peak = std::max(measured_peak, double(after.peak_bytes));
  }
  // The planner's most loaded stage is the measured one.
  const MemoryBreakdown most = estimate_memory(setup, layout);
  EXPECT_DOUBLE_EQ(most.total, predicted_peak);
  EXPECT_DOUBLE_EQ(double(run.stage(int(most.stage)).finished.peak_bytes), measured_peak);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, StagesMatchTheArena,
    ::testing::Values(
        StageCase{"gpt2-tiny", "pp2", "fp32"}, StageCase{"gpt2-tiny", "pp2+v2", "fp32"},
        StageCase{"gpt2-tiny", "pp2+gpipe", "bf16"}, StageCase{"gpt2-tiny", "pp2+zb", "fp32"},
        StageCase{"gpt2-tiny", "pp2+rc-sel", "fp32"}, StageCase{"gpt2-tiny", "pp2+rc-full", "bf16"},
        StageCase{"gpt2-tiny", "rc-sel", "fp32"}, StageCase{"gpt2-tiny", "tp2+sp+rc-full", "fp32"},
        StageCase{"llama-tiny", "pp2+v2", "bf16"},
        StageCase{"llama-tiny", "pp2+gpipe+rc-full", "fp32"},
        StageCase{"llama-tiny", "tp2+rc-sel", "bf16"}, StageCase{kOddModel, "pp2", "fp32"},
        // 4 ranks (3D): memory only, the cores are oversubscribed.
        StageCase{"gpt2-tiny", "pp2+dp2+zero1", "fp32"},
        StageCase{"llama-tiny", "pp2+tp2+sp", "bf16"},
        StageCase{kOddModel, "dp2+zero1+rc-full", "fp32"}, StageCase{"mixtral-tiny", "pp2", "fp32"},
        StageCase{"mixtral-tiny", "rc-full", "bf16"},
        StageCase{"mixtral-tiny", "dp2+ep2+rc-sel", "fp32"},
        StageCase{"mixtral-tiny", "pp2+dp2+ep2", "bf16"}),
    stage_case_name);

// Lattice's ZeRO-2/3 (docs/data-parallel.md): between steps the gradient shard (and, ZeRO-3,
// the master shard) are live; the peaks add the gradient buckets lent to the backward (gpt2-tiny
// fits one 1 MiB bucket, so the planner's bound — every bucket lent — is what happens) and,
// ZeRO-3, the gathered ends and two layers.
class ZeroStagesMatchTheArena : public ::testing::TestWithParam<Case> {};

TEST_P(ZeroStagesMatchTheArena, ShardsBetweenStepsAndPeaksWithTheTransientBuffers) {
  const Case c = GetParam();
  const PlannedRun planned = plan_and_run(c, "plan_zero_", 2);
  const Layout& layout = planned.layout;
  const MemoryBreakdown& predicted = planned.predicted;
  const LayoutRunResult& run = planned.run;
  const double n = predicted.parameter_count, dp = double(layout.dp);
  EXPECT_DOUBLE_EQ(n, double(run.unpadded_elements));
  // Rank 0's shard of the padded store, ceil16(ceil(P / dp)) elements.
  const double shard = double(((run.store_elements + layout.dp - 1) / layout.dp + 15) / 16 * 16);
  const MemoryStats& after = run.finished;
  auto peak = [&](MemoryCategory category) {
    return double(after.peak_by_category[size_t(category)]);
  };
  EXPECT_DOUBLE_EQ(double(live(after, MemoryCategory::kGradients)), 4.0 * shard);
  EXPECT_NEAR(predicted.gradients, 4.0 * n / dp + 4.0 * n, 1e-6);
  EXPECT_NEAR(peak(MemoryCategory::kGradients), predicted.gradients, 0.01 * predicted.gradients)
      << "one bucket: all of it lent during the backward";
  EXPECT_GT(peak(MemoryCategory::kGradients), double(live(after, MemoryCategory::kGradients)));
  if (layout.zero >= 3) {
    EXPECT_DOUBLE_EQ(double(live(after, MemoryCategory::kParameters)), 4.0 * shard)
        << "the master shard only between steps";
    EXPECT_NEAR(peak(MemoryCategory::kParameters), predicted.parameters,
                0.01 * predicted.parameters);
  } else {
    EXPECT_NEAR(peak(MemoryCategory::kParameters), predicted.parameters,
                0.01 * predicted.parameters);
  }
  EXPECT_NEAR(peak(MemoryCategory::kOptimizerState), predicted.optimizer_states,
              0.01 * predicted.optimizer_states);
  EXPECT_DOUBLE_EQ(predicted.activations + predicted.recompute_working +
                       predicted.embedding_activations + predicted.logits,
                   peak(MemoryCategory::kActivations));
  EXPECT_NEAR(predicted.total - predicted.fragmentation, double(after.peak_bytes),
              0.01 * double(after.peak_bytes));
}

INSTANTIATE_TEST_SUITE_P(Layouts, ZeroStagesMatchTheArena,
                         ::testing::Values(Case{"gpt2-tiny", "dp2+zero2", "fp32"},
                                           Case{"gpt2-tiny", "dp2+zero2", "bf16"},
                                           Case{kOddModel, "dp2+zero2", "bf16"},
                                           Case{"gpt2-tiny", "dp2+zero3", "bf16"},
                                           Case{"llama-tiny", "dp2+zero3", "fp32"}),
                         case_name);

TEST(StageLayouts, RejectedWithTheReason) {
  auto setup_for = [](const Layout& layout) {
    TrainingSetup setup = lattice_setup("gpt2-tiny", layout, Precision::kFp32);
    setup.model.n_layers = 3;
    return setup;
  };
  // Three layers over two stages: the runtime's balanced partition splits them, and so does
  // the planner (priced per stage).
  Layout uneven = parse_validation_layout("pp2+mb1");
  EXPECT_FALSE(check_layout(setup_for(uneven), uneven).has_value());
  EXPECT_EQ(stage_layers(setup_for(uneven), uneven, 0) + stage_layers(setup_for(uneven), uneven, 1),
            3);
  std::optional<Rejection> rejection;
  // zb-h1 keeps activations for its weight pass; recompute drops them. Refused by the planner
  // and by the runtime alike.
  for (const char* text : {"pp2+zb+rc-sel+mb1", "pp2+zb+rc-full+mb1"}) {
    Layout zb = parse_validation_layout(text);
    TrainingSetup setup = setup_for(zb);
    setup.model.n_layers = 4;
    rejection = check_layout(setup, zb);
    ASSERT_TRUE(rejection.has_value()) << text;
    EXPECT_EQ(rejection->reason, RejectReason::kSchedule);
    EXPECT_NE(rejection->message.find("zb-h1 defers weight gradients"), std::string::npos)
        << rejection->message;
  }
  TrainConfig config;
  config.model = trainer_model("gpt2-tiny");
  config.data_dir = testing::make_corpus_dir("plan_stages_zb_recompute").string();
  config.global_batch = 4;
  config.micro_batches = 4;
  config.micro_batch = 1;
  config.seq_len = config.model.seq_len;
  ParallelConfig zero_bubble_recompute;
  zero_bubble_recompute.pp = 2;
  zero_bubble_recompute.schedule = ScheduleKind::kZeroBubbleH1;
  zero_bubble_recompute.recompute = lattice::Recompute::kSelective;
  EXPECT_THROW(run_layout(config, {.layout = zero_bubble_recompute, .steps = 0}), ConfigError);
  // Lattice's ZeRO-2/3 run without a pipeline only (the trainer refuses the pair as well).
  Layout zero_pipeline = parse_validation_layout("pp2+dp2+zero2+mb1");
  TrainingSetup zero_setup = setup_for(zero_pipeline);
  zero_setup.model.n_layers = 4;
  rejection = check_layout(zero_setup, zero_pipeline);
  ASSERT_TRUE(rejection.has_value());
  EXPECT_NE(rejection->message.find("ZeRO-2 with pp 2"), std::string::npos) << rejection->message;
  // Without the recompute both accept it.
  Layout zb = parse_validation_layout("pp2+zb+mb1");
  TrainingSetup setup = setup_for(zb);
  setup.model.n_layers = 4;
  EXPECT_FALSE(check_layout(setup, zb).has_value());
}

// ---- the comparison itself ----

TEST(ValidationRows, RatiosAndFlagsFollowTheTolerances) {
  MemoryBreakdown memory;
  memory.parameters = 1000;
  memory.gradients = 1000;
  memory.optimizer_states = 2000;
  memory.activations = 300;
  memory.logits = 100;
  memory.embedding_activations = 20;
  memory.fragmentation = 50;
  memory.total = 4000 + 420 + 50;
  TimeBreakdown time;
  time.step = 0.010;
  MeasuredRun measured{.parameters = 1008,  // 0.8% off: within 1%
                       .gradients = 1030,   // 2.9% off: flagged
                       .optimizer_states = 2000,
                       .activations = 840,  // predicted 420: ratio 0.5, flagged
                       .other = 0,
                       .total = 5000,
                       .step_seconds = 0.025};  // factor 2.5 > 2: flagged
  ValidationTolerance factor_two;
  factor_two.time_factor = 2.0;
  const LayoutValidation v =
      compare_layout("dp1 tp1", Layout{}, memory, time, measured, factor_two);
  ASSERT_EQ(v.rows.size(), 7u);
  EXPECT_EQ(v.rows[0].quantity, "parameters");
  EXPECT_FALSE(v.rows[0].flagged());
  EXPECT_TRUE(v.rows[1].flagged());
  EXPECT_FALSE(v.rows[2].flagged());
  EXPECT_DOUBLE_EQ(v.rows[3].predicted, 420);
  EXPECT_DOUBLE_EQ(v.rows[3].ratio(), 0.5);
  EXPECT_TRUE(v.rows[3].flagged());
  EXPECT_FALSE(v.rows[4].flagged()) << "nothing predicted, nothing measured";
  EXPECT_DOUBLE_EQ(v.rows[5].predicted, 4420) << "the total leaves out the fragmentation allowance";
  EXPECT_TRUE(v.rows[5].flagged());  // 4420 / 5000 = 0.884
  EXPECT_TRUE(v.rows[6].is_time);
  EXPECT_DOUBLE_EQ(v.rows[6].ratio(), 0.4);
  EXPECT_TRUE(v.rows[6].flagged());
  EXPECT_EQ(v.flagged_count(), 4);

  measured.step_seconds = 0.006;  // predicted 1.67× slower: within a factor 2, not 15%
  EXPECT_FALSE(compare_layout("x", Layout{}, memory, time, measured, factor_two).rows[6].flagged());
  EXPECT_TRUE(compare_layout("x", Layout{}, memory, time, measured, {}).rows[6].flagged());
  measured.step_seconds = 0.0088;  // predicted 1.136× slower: within the default 15%
  EXPECT_FALSE(compare_layout("x", Layout{}, memory, time, measured, {}).rows[6].flagged());
  measured.other = 64;  // something allocated that the planner does not predict
  EXPECT_TRUE(compare_layout("x", Layout{}, memory, time, measured, {}).rows[4].flagged());

  const std::string table = format_validation({v});
  EXPECT_NE(table.find("step time"), std::string::npos);
  EXPECT_NE(table.find("NO (factor > 2.00)"), std::string::npos);
  EXPECT_EQ(to_json(v)["flagged"], 4);

  // Pipeline layouts get a peak-over-stages row before the step time.
  LayoutValidation piped =
      compare_layout("pp2", Layout{.pp = 2}, memory, time, measured, factor_two);
  add_peak_over_stages(piped, 5000, 5100, 0.01);
  ASSERT_EQ(piped.rows.size(), 8u);
  EXPECT_EQ(piped.rows[6].quantity, "peak over stages");
  EXPECT_TRUE(piped.rows[6].flagged());  // 2% off
  EXPECT_TRUE(piped.rows[7].is_time);
}

TEST(ValidationLayouts, NamesParseAndPrint) {
  const Layout plain = parse_validation_layout("dp1tp1");
  EXPECT_EQ(plain.dp, 1);
  EXPECT_EQ(plain.tp, 1);
  EXPECT_EQ(validation_layout_name(plain), "dp1 tp1");
  const Layout sp = parse_validation_layout("tp2+sp");
  EXPECT_EQ(sp.tp, 2);
  EXPECT_TRUE(sp.sequence_parallel);
  EXPECT_EQ(validation_layout_name(sp), "tp2 sp");
  const Layout zero = parse_validation_layout("dp2+zero1");
  EXPECT_EQ(zero.dp, 2);
  EXPECT_EQ(zero.zero, 1);
  EXPECT_EQ(validation_layout_name(zero), "dp2 zero1");
  EXPECT_EQ(validation_layout_name(parse_validation_layout("dp2tp2")), "dp2 tp2");
  const Layout pipeline = parse_validation_layout("pp2+v2+mb2");
  EXPECT_EQ(pipeline.pp, 2);
  EXPECT_EQ(pipeline.virtual_stages, 2);
  EXPECT_EQ(pipeline.schedule, Schedule::kInterleaved1F1B);
  EXPECT_EQ(pipeline.micro_batch, 2);
  EXPECT_EQ(validation_layout_name(pipeline), "pp2 v2");
  EXPECT_EQ(parse_validation_layout("pp2").schedule, Schedule::kOneFOneB);
  EXPECT_EQ(parse_validation_layout("pp2").micro_batch, 0) << "not given: the caller chooses";
  EXPECT_EQ(validation_layout_name(parse_validation_layout("pp2+gpipe")), "pp2 gpipe");
  EXPECT_EQ(validation_layout_name(parse_validation_layout("pp2+zb-h1")), "pp2 zb");
  const Layout recompute = parse_validation_layout("dp2tp2+sp+zero1+rc-full");
  EXPECT_EQ(recompute.recompute, Recompute::kFull);
  EXPECT_EQ(validation_layout_name(recompute), "dp2 tp2 sp zero1 rc-full");
  EXPECT_EQ(validation_layout_name(parse_validation_layout("rc-sel")), "dp1 tp1 rc-sel");
  EXPECT_THROW(parse_validation_layout("gpipe"), ConfigError);
  EXPECT_THROW(parse_validation_layout("dp2+gpipe"), ConfigError) << "a schedule needs pp > 1";
  EXPECT_THROW(parse_validation_layout("pp2+gpipe+zb"), ConfigError) << "two schedules";
  EXPECT_THROW(parse_validation_layout("pp2+rc"), ConfigError);
  EXPECT_THROW(parse_validation_layout("dp"), ConfigError);
  EXPECT_THROW(parse_validation_layout("sp"), ConfigError);
  EXPECT_THROW(parse_validation_layout("dp1+sp"), ConfigError);
  EXPECT_THROW(parse_validation_layout("dp1+zero1"), ConfigError);
}

// ---- fused (flash-style) attention at long sequences: the planner against the arena ----

// Activation bytes after a step of `model` at sequence `seq` (one micro-batch of kGlobalBatch
// sequences): predicted by the planner and measured by the arena.
std::pair<double, double> long_sequence_activations(const char* layout_words, int64_t seq,
                                                    const char* model = "llama-tiny") {
  Layout layout = parse_validation_layout(layout_words);
  layout.micro_batch = kGlobalBatch / layout.dp;
  TrainingSetup setup = lattice_setup(model, layout, Precision::kFp32);
  setup.model.max_seq_len = setup.seq_len = seq;
  const MemoryBreakdown predicted = estimate_memory(setup, layout);

  TrainConfig config;
  config.model = trainer_model(model);
  config.model.seq_len = seq;
  config.data_dir = testing::make_corpus_dir(
                        fmt::format("plan_long_{}_{}_{}_{}", model, seq, layout.tp, layout.cp))
                        .string();
  config.global_batch = kGlobalBatch;
  config.micro_batches = 1;
  config.seq_len = seq;
  const LayoutRunResult run = run_layout(
      config, {.layout = runtime_layout(layout), .threads = 1, .warmup_steps = 0, .steps = 1});
  return {predicted.activations + predicted.recompute_working + predicted.embedding_activations +
              predicted.logits,
          double(run.finished.peak_by_category[size_t(MemoryCategory::kActivations)])};
}

TEST(LongSequences, FusedAttentionActivationsEqualTheArenaAndGrowLinearlyWithTheSequence) {
  // At 16× the preset's context the planner's flash-attention count (Korthikanti et al.'s
  // Table 2 without the a·s² score terms, plus the f32 log-sum-exp) is still exact, without and
  // with tp + SP; and the bytes grow as s, where stored scores would grow as s².
  for (const char* layout : {"dp1tp1", "tp2+sp"}) {
    const auto [predicted_256, measured_256] = long_sequence_activations(layout, 256);
    const auto [predicted_1024, measured_1024] = long_sequence_activations(layout, 1024);
    EXPECT_DOUBLE_EQ(predicted_256, measured_256) << layout;
    EXPECT_DOUBLE_EQ(predicted_1024, measured_1024) << layout;
    EXPECT_NEAR(measured_1024 / measured_256, 4.0, 0.05) << layout;
  }
  // The same model with the scores stored (Megatron's unfused path, dropout off) would need
  // more than 4× from 256 to 1024 tokens: the s² term.
  const ModelSpec m = model_preset("llama-tiny");
  auto stored = [&](int64_t seq) {
    return layer_activation_bytes(
        m, {.micro_batch = 1, .seq_len = seq, .tp = 1, .flash_attention = false});
  };
  EXPECT_GT(stored(1024) / stored(256), 4.5);
}

// Context parallelism: a rank's activations are its 1/cp of the positions, as the planner
// counts them (plus the whole rows the trainer reads before taking its chunks), alone and with
// tp + SP; the planner's prediction equals the arena's peak.
TEST(LongSequences, ContextParallelActivationsEqualTheArenaAndFallAsOneOverCp) {
  const auto [predicted_one, measured_one] = long_sequence_activations("dp1tp1", 1024);
  EXPECT_DOUBLE_EQ(predicted_one, measured_one);
  for (const auto& [layout, cp] : {std::pair{"cp2", 2}, {"cp4", 4}, {"tp2+sp+cp2", 2}}) {
    const auto [predicted, measured] = long_sequence_activations(layout, 1024);
    EXPECT_DOUBLE_EQ(predicted, measured) << layout;
    if (std::string(layout).starts_with("cp")) {
      EXPECT_NEAR(measured / measured_one, 1.0 / cp, 0.01) << layout;
    }
  }
}

// GPT-2's attention reads q, k and v in place in the fused projection; under context
// parallelism the ring needs them split (and their gradients apart). The planner counts each
// case as the arena allocates it.
TEST(LongSequences, Gpt2SplitsItsQkvOnlyUnderContextParallelismAsThePlannerCounts) {
  for (const char* layout : {"dp1tp1", "cp2", "tp2+sp+cp2"}) {
    const auto [predicted, measured] = long_sequence_activations(layout, 256, "gpt2-tiny");
    EXPECT_DOUBLE_EQ(predicted, measured) << layout;
  }
}

}  // namespace
}  // namespace lattice::plan
