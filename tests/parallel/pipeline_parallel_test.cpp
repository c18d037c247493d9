// Pipeline parallelism against the single-rank run (DESIGN.md invariant 1): every schedule
// (gpipe, 1f1b, interleaved-1f1b with two chunks per stage, zb-h1 with split backward) on 2 and
// 4 stages, with and without activation recompute, and the full 3D mesh dp2·tp2·pp2 with
// ZeRO-1: the per-step loss of ten steps (and the validation loss) within 1e-5 relative of the
// single rank's; the same layout twice bitwise identical.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>

#include "../train/equivalence_config.h"
#include "../train/test_corpus.h"
#include "comm/thread_world.h"
#include "parallel/device_mesh.h"
#include "trace/chrome_trace.h"
#include "trace/event_recorder.h"
#include "train/trainer.h"

namespace lattice {
namespace {

constexpr int kSteps = 10;

ModelConfig eight_layers(const std::string& preset) {
  ModelConfig c = model_preset(preset);
  c.n_layer = 8;  // p·v up to 8 chunks
  c.d_model = 32;
  c.n_head = 4;
  c.n_kv_head = preset == "llama-tiny" ? 2 : 4;
  c.d_ff = preset == "llama-tiny" ? 88 : 128;
  c.seq_len = 12;
  return c;
}

TrainConfig pipeline_config(const std::string& preset, const std::filesystem::path& data) {
  TrainConfig c = testing::equivalence_config(eight_layers(preset), data,
                                              {.micro_batches = 4, .steps = kSteps});
  c.eval_batches = 1;
  return c;
}

struct Layout {
  MeshShape shape;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  int virtual_stages = 1;
  bool sp = false;
  int zero = 0;
  Recompute recompute = Recompute::kNone;
};

struct PipelineRun {
  std::vector<double> losses, norms;
  double val_loss = 0.0;
  std::vector<float> rank0_params;
  PipelineStepStats rank0_stats;
  size_t rank0_activation_peak = 0;  // bytes
};

PipelineRun train(const TrainConfig& config, const Layout& l) {
  PipelineRun run;
  std::mutex mutex;
  run_ranks(l.shape.world_size(), [&](Communicator& comm) {
    DeviceMesh mesh(comm, l.shape);
    Arena arena(fmt::format("rank{}", comm.rank()));
    Trainer trainer(config, arena,
                    {.dp = &mesh.dp(),
                     .zero = l.zero,
                     .bucket_bytes = 8 << 10,
                     .check_replicas = l.shape.dp > 1,
                     .threads = 1,
                     .tp = &mesh.tp(),
                     .sequence_parallel = l.sp,
                     .pp = &mesh.pp(),
                     .embedding = mesh.embedding(),
                     .schedule = l.schedule,
                     .virtual_stages = l.virtual_stages,
                     .recompute = l.recompute});
    std::vector<double> losses, norms;
    for (int s = 0; s < kSteps; ++s) {
      StepMetrics m = trainer.train_step();
      losses.push_back(m.loss);
      norms.push_back(m.grad_norm);
    }
    const double val = trainer.evaluate();
    if (comm.rank() == 0) {
      std::lock_guard lock(mutex);
      run.losses = losses;
      run.norms = norms;
      run.val_loss = val;
      const Tensor& master = trainer.model().parameters().master();
      run.rank0_params.assign(master.data<float>(), master.data<float>() + master.numel());
      run.rank0_stats = trainer.pipeline_stats();
      run.rank0_activation_peak =
          arena.stats().peak_by_category[size_t(MemoryCategory::kActivations)];
    }
  });
  return run;
}

void expect_matches(const PipelineRun& single, const PipelineRun& split, const std::string& what) {
  ASSERT_EQ(split.losses.size(), single.losses.size());
  for (size_t s = 0; s < single.losses.size(); ++s) {
    EXPECT_NEAR(split.losses[s], single.losses[s], 1e-5 * single.losses[s])
        << what << " step " << s + 1;
    EXPECT_NEAR(split.norms[s], single.norms[s], 1e-4 * single.norms[s])
        << what << " step " << s + 1;
  }
  EXPECT_NEAR(split.val_loss, single.val_loss, 1e-5 * single.val_loss) << what;
}

struct Case {
  const char* preset;
  int pp;
  ScheduleKind schedule;
  int v;
  Recompute recompute = Recompute::kNone;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.preset << " pp" << c.pp << " " << schedule_kind_name(c.schedule) << " v" << c.v
      << " recompute " << recompute_name(c.recompute);
}

class PipelineEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineEquivalence, TenStepsMatchTheSingleRankRun) {
  const Case c = GetParam();
  auto dir = testing::make_corpus_dir(
      std::string("pp_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  const TrainConfig config = pipeline_config(c.preset, dir);
  const PipelineRun single = train(config, {.shape = {1, 1, 1}});
  const Layout layout{.shape = {c.pp, 1, 1},
                      .schedule = c.schedule,
                      .virtual_stages = c.v,
                      .recompute = c.recompute};
  const PipelineRun split = train(config, layout);
  if (c.recompute != Recompute::kNone) {
    // Recompute really ran: the stage kept fewer activation bytes than without it.
    Layout kept = layout;
    kept.recompute = Recompute::kNone;
    EXPECT_LT(split.rank0_activation_peak, train(config, kept).rank0_activation_peak)
        << recompute_name(c.recompute);
  }
  expect_matches(
      single, split,
      fmt::format("{} pp{} {} v{}", c.preset, c.pp, schedule_kind_name(c.schedule), c.v));
  EXPECT_GT(single.norms[0], config.grad_clip) << "clipping should be active";
  if (c.pp > 1) {
    EXPECT_GT(split.rank0_stats.transfers, 0);
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = fmt::format("{}_pp{}_{}_v{}_{}", info.param.preset, info.param.pp,
                                 schedule_kind_name(info.param.schedule), info.param.v,
                                 recompute_name(info.param.recompute));
  for (char& ch : name) {
    if (ch == '-') ch = '_';
  }
  return name;
}

// Every combination: both families × pp ∈ {1, 2, 4} × every schedule (interleaved with v = 2,
// the others v = 1) × recompute ∈ {none, selective, full}; zb-h1 keeps every activation (its
// weight pass reads them), so it runs without recompute only. pp = 1 is the plain step.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
      cases.push_back({preset, 1, ScheduleKind::kOneFOneB, 1, r});
    }
    for (int pp : {2, 4}) {
      for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB,
                                ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubbleH1}) {
        const int v = kind == ScheduleKind::kInterleaved1F1B ? 2 : 1;
        for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
          if (kind == ScheduleKind::kZeroBubbleH1 && r != Recompute::kNone) continue;
          cases.push_back({preset, pp, kind, v, r});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineEquivalence, ::testing::ValuesIn(all_cases()),
                         case_name);

TEST(PipelineParallel, ThreeDimensionalMeshWithZeroOneMatchesTheSingleRankRun) {
  auto dir = testing::make_corpus_dir("pp_3d");
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    const TrainConfig config = pipeline_config(preset, dir);
    const PipelineRun single = train(config, {.shape = {1, 1, 1}});
    const PipelineRun mesh = train(config, {.shape = {2, 2, 2}, .sp = true, .zero = 1});
    expect_matches(single, mesh, fmt::format("{} pp2·dp2·tp2 sp zero1", preset));
  }
}

// Recompute repeats the forward exactly: the same bits as keeping the activations, with tensor
// and sequence parallelism too (the recomputed forward issues the same collectives), and less
// activation memory.
TEST(PipelineParallel, RecomputeIsBitwiseTheRunWithoutItUnderTensorParallelism) {
  auto dir = testing::make_corpus_dir("recompute_tp");
  const TrainConfig config = pipeline_config("llama-tiny", dir);
  const PipelineRun kept = train(config, {.shape = {2, 1, 2}, .sp = true});
  for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    const PipelineRun recomputed = train(config, {.shape = {2, 1, 2}, .sp = true, .recompute = r});
    EXPECT_EQ(recomputed.losses, kept.losses) << recompute_name(r);
    EXPECT_EQ(std::memcmp(recomputed.rank0_params.data(), kept.rank0_params.data(),
                          kept.rank0_params.size() * sizeof(float)),
              0)
        << recompute_name(r);
  }
}

// --trace: the runtime records every compute instruction, every receive (as idle: the bubble)
// and every send of the schedule on the rank's recorder, and the trace file holds them.
TEST(PipelineParallel, TraceRecordsEveryInstructionOfTheSchedule) {
  auto dir = testing::make_corpus_dir("pp_trace");
  const TrainConfig config = pipeline_config("gpt2-tiny", dir);
  const auto trace_dir = dir / "trace";
  const auto origin = TraceClock::now();
  run_ranks(2, [&](Communicator& comm) {
    EventRecorder recorder(comm.rank(), origin);
    ScopedCurrentRecorder current(&recorder);
    DeviceMesh mesh(comm, {2, 1, 1});
    Arena arena(fmt::format("rank{}", comm.rank()));
    Trainer trainer(config, arena,
                    {.threads = 1,
                     .pp = &mesh.pp(),
                     .embedding = mesh.embedding(),
                     .schedule = ScheduleKind::kZeroBubbleH1});
    StepMetrics m = trainer.train_step();
    ASSERT_TRUE(m.bubble_fraction.has_value());
    EXPECT_GT(*m.bubble_fraction, 0.0);
    EXPECT_LT(*m.bubble_fraction, 1.0);
    const auto& program = trainer.pipeline_schedule().per_rank[size_t(comm.rank())];
    std::map<std::string, int> expected;
    for (const Instruction& in : program) {
      if (in.op != Op::kReduceGrads && in.op != Op::kOptimizerStep)
        ++expected[std::string(op_name(in.op))];
    }
    const auto path = write_chrome_trace_to_dir(trace_dir, recorder);
    const RankTrace trace = read_chrome_trace(path);
    EXPECT_EQ(trace.rank, comm.rank());
    std::map<std::string, int> recorded;
    int steps = 0;
    for (const TraceEvent& e : trace.events) {
      if (e.category == TraceCategory::kStep) ++steps;
      if (expected.count(e.name)) ++recorded[e.name];
    }
    EXPECT_EQ(recorded, expected) << "rank " << comm.rank();
    EXPECT_EQ(steps, 1);
  });
}

// 1F1B bounds the micro-batches in flight on stage r by p − r where GPipe keeps all m: the
// first stage's activation memory is (slots × one micro-batch's activations + scratch), with
// slots = m for gpipe and p for 1f1b.
TEST(PipelineParallel, OneFOneBKeepsFewerMicroBatchesOfActivationsThanGpipe) {
  auto dir = testing::make_corpus_dir("pp_memory");
  TrainConfig config = pipeline_config("gpt2-tiny", dir);
  config.micro_batches = 8;
  config.global_batch = 8;
  std::map<ScheduleKind, size_t> peak;
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB}) {
    run_ranks(2, [&](Communicator& comm) {
      DeviceMesh mesh(comm, {2, 1, 1});
      Arena arena(fmt::format("rank{}", comm.rank()));
      Trainer trainer(
          config, arena,
          {.threads = 1, .pp = &mesh.pp(), .embedding = mesh.embedding(), .schedule = kind});
      trainer.train_step();
      if (comm.rank() == 0) {
        peak[kind] = arena.stats().peak_by_category[size_t(MemoryCategory::kActivations)];
      }
    });
  }
  // The scratch is the same in both; the slots differ: 8 for gpipe, 2 for 1f1b on stage 0.
  // peak = scratch + slots·per_slot, so per_slot = (gpipe − 1f1b) / 6 and it must be positive
  // and account for most of gpipe's peak.
  const double per_slot =
      (double(peak[ScheduleKind::kGpipe]) - double(peak[ScheduleKind::kOneFOneB])) / 6.0;
  EXPECT_GT(per_slot, 0.0);
  EXPECT_GT(8.0 * per_slot, 0.5 * double(peak[ScheduleKind::kGpipe]));
  EXPECT_LT(double(peak[ScheduleKind::kOneFOneB]), 0.5 * double(peak[ScheduleKind::kGpipe]));
}

TEST(PipelineParallel, SameLayoutTwiceIsBitwiseIdentical) {
  auto dir = testing::make_corpus_dir("pp_bitwise");
  const TrainConfig config = pipeline_config("gpt2-tiny", dir);
  const Layout layout{
      .shape = {2, 1, 1}, .schedule = ScheduleKind::kInterleaved1F1B, .virtual_stages = 2};
  const PipelineRun a = train(config, layout);
  const PipelineRun b = train(config, layout);
  ASSERT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.rank0_params.size(), b.rank0_params.size());
  EXPECT_EQ(std::memcmp(a.rank0_params.data(), b.rank0_params.data(),
                        a.rank0_params.size() * sizeof(float)),
            0);
}

TEST(PipelineParallel, LayoutsThePipelineCannotTakeAreRefused) {
  auto dir = testing::make_corpus_dir("pp_errors");
  TrainConfig config = pipeline_config("gpt2-tiny", dir);
  // Interleaving needs micro-batches divisible by the stages.
  config.micro_batches = 2;
  EXPECT_THROW(
      train(config,
            {.shape = {4, 1, 1}, .schedule = ScheduleKind::kInterleaved1F1B, .virtual_stages = 2}),
      ConfigError);
  // More chunks than layers.
  config = pipeline_config("gpt2-tiny", dir);
  config.model.n_layer = 3;
  EXPECT_THROW(train(config, {.shape = {4, 1, 1}}), ConfigError);
}

}  // namespace
}  // namespace lattice
