// The doctor's checks (issue: "one test each that creates the condition and expects the doctor
// to name it"): a healthy layout passes every check; each condition, created in the config, the
// machine's description, the files, or the probe's real run (its test hooks), fails or warns
// exactly the check that names it.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "ckpt/hf_format.h"
#include "ckpt/safetensors.h"
#include "ckpt/trainer_checkpoint.h"
#include "doctor/doctor.h"
#include "model/parameters.h"
#include "support/scratch_dir.h"
#include "train/train_benchmark.h"
#include "train/trainer.h"

namespace lattice::doctor {
namespace {

namespace fs = std::filesystem;

TrainConfig tiny(int dp, int tp, int pp = 1) {
  TrainConfig config;
  config.model = model_preset("gpt2-tiny");
  config.micro_batch = 2;
  config.global_batch = 0;
  config.micro_batches = 1;
  config.steps = 20;
  config.threads = 1;
  config.parallel.dp = dp;
  config.parallel.tp = tp;
  config.parallel.pp = pp;
  return config;
}

// A machine with room for every layout the tests run, nothing set that fights the budget.
MachineFacts roomy_machine() {
  return {.cores = 16,
          .numa_nodes = 1,
          .numa_nodes_spanned = 1,
          .available_memory_bytes = int64_t(16) << 30,
          .omp_num_threads = std::nullopt,
          .cpu_distance = {},  // not measured: its own test sets it
          .transparent_huge_pages = "madvise"};
}

DoctorInput input_for(const TrainConfig& config, bool probe, const ProbeOptions& options = {}) {
  DoctorInput input{.config = config, .machine = roomy_machine()};
  if (probe) input.probe = run_probe(config, options);
  return input;
}

const CheckResult& result_of(const std::vector<CheckResult>& results, const std::string& id) {
  for (const CheckResult& r : results)
    if (r.id == id) return r;
  throw std::runtime_error("no check " + id);
}

// The ids of the checks with this verdict.
std::set<std::string> with_verdict(const std::vector<CheckResult>& results, Verdict verdict) {
  std::set<std::string> ids;
  for (const CheckResult& r : results)
    if (r.verdict == verdict) ids.insert(r.id);
  return ids;
}

// A checkpoint of one step of `config` on one rank (random tokens of length `seq`).
fs::path saved_checkpoint(const fs::path& root, TrainConfig config, int64_t seq, uint64_t seed) {
  config.seq_len = seq;
  config.resolve_batch(1);
  Arena arena("save");
  Trainer trainer(
      config, arena, {},
      {.train = random_token_file(config.global_batch, seq, config.model.vocab_size, seed),
       .val = nullptr});
  trainer.train_step();
  return save_trainer_checkpoint(root, trainer, nullptr);
}

std::string all_text(const std::vector<CheckResult>& results) {
  return format_results(results);
}

TEST(Doctor, AHealthyLayoutPassesEveryCheck) {
  TrainConfig config = tiny(2, 2);
  config.parallel.zero = 1;
  config.parallel.recompute = Recompute::kSelective;
  config.out_dir = testing::scratch_dir("doctor_healthy").string();
  Arena arena("export");
  Transformer weights(config.model, arena, DType::kF32);
  weights.initialize(5);
  export_hf(fs::path(config.out_dir) / "hf", weights);
  // A checkpoint of the same run on one rank (any layout resumes any other).
  TrainConfig one_rank = config;
  one_rank.parallel = ParallelConfig{};
  one_rank.micro_batches = 2;
  config.seq_len = 16;
  const fs::path checkpoint =
      saved_checkpoint(fs::path(config.out_dir) / "checkpoints", one_rank, 16, 4);
  DoctorInput input = input_for(config, true);
  // The run's GEMM as time_gemm_libraries gives it, the configured library (oneDNN) fastest:
  // a real timing's verdict is this machine's, not the layout's.
  input.gemm_libraries =
      GemmLibraryTiming{.m = 32,
                        .k = 64,
                        .n = 256,
                        .dtype = DType::kF32,
                        .threads = 1,
                        .flops_per_s = {{GemmLibrary::kOneDnn, 20e9}, {GemmLibrary::kMkl, 15e9}}};
  input.init_from = fs::path(config.out_dir) / "hf";
  input.resume_from = checkpoint;
  const std::vector<CheckResult> results = run_checks(input);
  EXPECT_TRUE(with_verdict(results, Verdict::kFail).empty()) << all_text(results);
  // The network check judges collective times: on a loaded machine it may warn.
  std::set<std::string> warned = with_verdict(results, Verdict::kWarn);
  warned.erase("network");
  EXPECT_TRUE(warned.empty()) << all_text(results);
  // With dp, tp, ZeRO-1, recompute, weights to start from, a checkpoint to resume, an output
  // directory and the run's GEMM timed in two libraries every check applies.
  EXPECT_TRUE(with_verdict(results, Verdict::kNotApplicable).empty()) << all_text(results);
  EXPECT_EQ(results.size(), doctor_checks().size());
}

// The run's GEMM is timed on the config's shapes (tokens of a micro-batch, d_model, d_ff ÷ tp)
// in every library the build has.
TEST(Doctor, TheRunsGemmIsTimedInEveryLibraryOnTheConfigsShape) {
  TrainConfig config = tiny(1, 2);
  config.seq_len = 16;
  const GemmLibraryTiming t = time_gemm_libraries(config, roomy_machine());
  EXPECT_EQ(t.m, 2 * 16);  // micro-batch 2 of 16 tokens
  EXPECT_EQ(t.k, config.model.d_model);
  EXPECT_EQ(t.n, config.model.d_ff / 2);  // tp 2
  EXPECT_EQ(t.dtype, DType::kF32);
  EXPECT_EQ(t.threads, 1);  // train.threads
  ASSERT_EQ(t.flops_per_s.size(), available_gemm_libraries().size());
  for (const auto& [library, flops] : t.flops_per_s) {
    EXPECT_GT(flops, 0.0) << gemm_library_key(library);
  }
  EXPECT_EQ(gemm_library(), GemmLibrary::kOneDnn) << "the library chosen before is chosen again";
}

// Another library 25 % or more faster on the run's GEMM warns and names the setting; within
// 25 %, or the configured one fastest, passes; one library, or none measured, does not apply.
TEST(Doctor, AGemmLibraryAnotherOutrunsWarnsAndNamesTheSetting) {
  DoctorInput input{.config = tiny(1, 1), .machine = roomy_machine()};
  const GemmLibraryTiming t{
      .m = 64,
      .k = 32,
      .n = 128,
      .dtype = DType::kBF16,
      .threads = 2,
      .flops_per_s = {{GemmLibrary::kOneDnn, 100e9}, {GemmLibrary::kMkl, 160e9}}};
  input.gemm_libraries = t;
  CheckResult r = result_of(run_checks(input), "gemm-library");
  EXPECT_EQ(r.verdict, Verdict::kWarn) << r.saw;
  EXPECT_NE(r.saw.find("train.gemm_library = \"onednn\""), std::string::npos) << r.saw;
  EXPECT_NE(r.saw.find("M 64 K 32 N 128, bf16, 2 thread(s)"), std::string::npos) << r.saw;
  EXPECT_NE(r.saw.find("(1.60x)"), std::string::npos) << r.saw;
  EXPECT_NE(r.fix.find("set train.gemm_library = \"mkl\""), std::string::npos) << r.fix;
  EXPECT_DOUBLE_EQ(r.figures.at("mkl_gflops").get<double>(), 160.0);
  EXPECT_EQ(r.figures.at("fastest"), "mkl");

  input.gemm_libraries->flops_per_s[GemmLibrary::kMkl] = 120e9;
  r = result_of(run_checks(input), "gemm-library");
  EXPECT_EQ(r.verdict, Verdict::kPass) << r.saw;
  EXPECT_NE(r.saw.find("within 25 % of the fastest"), std::string::npos) << r.saw;

  input.config.gemm_library = GemmLibrary::kMkl;
  r = result_of(run_checks(input), "gemm-library");
  EXPECT_EQ(r.verdict, Verdict::kPass) << r.saw;
  EXPECT_NE(r.saw.find("the fastest library here"), std::string::npos) << r.saw;

  input.config.gemm_library = GemmLibrary::kOneDnn;
  input.gemm_libraries->flops_per_s.erase(GemmLibrary::kMkl);
  r = result_of(run_checks(input), "gemm-library");
  EXPECT_EQ(r.verdict, Verdict::kNotApplicable) << r.saw;
  EXPECT_NE(r.saw.find("scripts/setup.sh unpacks oneMKL"), std::string::npos) << r.saw;

  input.gemm_libraries.reset();
  EXPECT_EQ(result_of(run_checks(input), "gemm-library").verdict, Verdict::kNotApplicable);
}

TEST(Doctor, ACollectiveDeadlineShorterThanTheStepFailsTimeouts) {
  TrainConfig config = tiny(2, 1);
  config.parallel.timeout_s = 1e-7;
  const std::vector<CheckResult> results = run_checks(input_for(config, true));
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"timeouts"})
      << all_text(results);
  EXPECT_NE(result_of(results, "timeouts").fix.find("parallel.timeout_s="), std::string::npos);
}

// The probe's optimizer time grows with the parameters, the rest of its step with the FLOPs:
// scaling the whole step by the FLOPs overestimated GPT-2 124M's step 2.3× (its slice's
// optimizer over the 38.6M-element embedding is much of the probe's step).
TEST(Doctor, ThePredictedStepScalesTheOptimizerByTheParametersAndTheRestByTheFlops) {
  TrainConfig config = tiny(1, 1);
  config.model = model_preset("gpt2-124m");
  config.model.seq_len = 256;
  config.seq_len = 256;
  config.micro_batch = 4;
  ProbeResult probe;
  probe.config = probe_config(config, 3);
  probe.layout.step_ms = {100.0, 100.0, 100.0};
  const double all_by_flops = predicted_step_seconds(config, probe, 1);
  // A step slowed by whatever else shared the cores does not move the prediction: the fastest.
  probe.layout.step_ms = {100.0, 340.0, 180.0};
  EXPECT_DOUBLE_EQ(predicted_step_seconds(config, probe, 1), all_by_flops);
  probe.layout.step_optimizer_ms = {0.0, 0.0, 0.0};
  EXPECT_DOUBLE_EQ(predicted_step_seconds(config, probe, 1), all_by_flops);
  probe.layout.step_optimizer_ms = {60.0, 60.0, 60.0};
  const double flops_scale = all_by_flops / 0.1;
  const double parameter_scale = double(ParameterRegistry(config.model).global_elements()) /
                                 double(ParameterRegistry(probe.config.model).global_elements());
  EXPECT_NEAR(predicted_step_seconds(config, probe, 1), 0.04 * flops_scale + 0.06 * parameter_scale,
              1e-9);
  EXPECT_LT(parameter_scale, flops_scale);
}

TEST(Doctor, AnElasticLadderOutOfOrderFailsTimeouts) {
  TrainConfig config = tiny(1, 1);
  config.elastic.heartbeat_interval_s = 2;
  config.elastic.heartbeat_timeout_s = 1;
  const std::vector<CheckResult> results = run_checks(input_for(config, false));
  const CheckResult& r = result_of(results, "timeouts");
  EXPECT_EQ(r.verdict, Verdict::kFail);
  EXPECT_NE(r.saw.find("elastic.heartbeat_interval_s"), std::string::npos) << r.saw;
}

TEST(Doctor, MoreInProcessRanksThanCoresFailsCores) {
  DoctorInput input = input_for(tiny(2, 2), false);
  input.machine.cores = 2;
  std::vector<CheckResult> results = run_checks(input);
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"cores"})
      << all_text(results);
  EXPECT_NE(result_of(results, "cores").saw.find("need 4 cores, 2 are available"),
            std::string::npos);
  input.oversubscribe = true;  // lattice train --oversubscribe: allowed, with a warning
  results = run_checks(input);
  EXPECT_EQ(result_of(results, "cores").verdict, Verdict::kWarn);
}

TEST(Doctor, AnOmpThreadCountThatFightsTheBudgetOrTwoNumaNodesWarnCores) {
  DoctorInput input = input_for(tiny(2, 1), false);
  input.machine.omp_num_threads = "8";
  std::vector<CheckResult> results = run_checks(input);
  EXPECT_EQ(with_verdict(results, Verdict::kWarn), std::set<std::string>{"cores"});
  EXPECT_NE(result_of(results, "cores").saw.find("OMP_NUM_THREADS=8"), std::string::npos);
  input.machine.omp_num_threads = "1";  // the budget itself: nothing to fight
  input.machine.numa_nodes = 2;
  input.machine.numa_nodes_spanned = 2;
  results = run_checks(input);
  EXPECT_EQ(with_verdict(results, Verdict::kWarn), std::set<std::string>{"cores"});
  EXPECT_NE(result_of(results, "cores").saw.find("span 2 NUMA nodes"), std::string::npos);
}

TEST(Doctor, TransparentHugePagesTurnedOffWarnCores) {
  DoctorInput input = input_for(tiny(2, 1), false);
  input.machine.transparent_huge_pages = "never";
  std::vector<CheckResult> results = run_checks(input);
  EXPECT_EQ(with_verdict(results, Verdict::kWarn), std::set<std::string>{"cores"})
      << all_text(results);
  const CheckResult& cores = result_of(results, "cores");
  EXPECT_NE(cores.saw.find("transparent huge pages are off"), std::string::npos) << cores.saw;
  EXPECT_NE(cores.fix.find("echo madvise > /sys/kernel/mm/transparent_hugepage/enabled"),
            std::string::npos)
      << cores.fix;
  EXPECT_EQ(cores.figures.at("transparent_huge_pages"), "never");
  // The arena's madvise is served under "madvise" and "always"; a kernel without them: nothing
  // to turn on.
  for (const char* mode : {"madvise", "always", ""}) {
    input.machine.transparent_huge_pages = mode;
    results = run_checks(input);
    EXPECT_EQ(result_of(results, "cores").verdict, Verdict::kPass) << mode << all_text(results);
  }
}

TEST(Doctor, TheHugePagesModeIsTheBracketedChoice) {
  EXPECT_EQ(selected_sysfs_choice("always [madvise] never"), "madvise");
  EXPECT_EQ(selected_sysfs_choice("[always] madvise never"), "always");
  EXPECT_EQ(selected_sysfs_choice("always madvise [never]\n"), "never");
  EXPECT_EQ(selected_sysfs_choice("always madvise never"), "");
}

TEST(Doctor, ARanksThreadsOnCpusFarApartWarnCores) {
  // One rank with 2 threads on CPUs a host placed on different dies (a cache line's round trip
  // of 320 ns, as the development VM read it) warns and names the fix; on one die (60 ns) or
  // with one thread per rank it does not.
  TrainConfig two_threads = tiny(1, 1);
  two_threads.threads = 2;
  DoctorInput input = input_for(two_threads, false);
  input.machine.cpu_distance.ns = 320;
  std::vector<CheckResult> results = run_checks(input);
  EXPECT_EQ(with_verdict(results, Verdict::kWarn), std::set<std::string>{"cores"})
      << all_text(results);
  const CheckResult& far = result_of(results, "cores");
  EXPECT_NE(far.saw.find("CPUs 0 and 1 320 ns apart; that is two dies"), std::string::npos)
      << far.saw;
  EXPECT_NE(far.fix.find("give each core a rank of its own"), std::string::npos) << far.fix;
  input.machine.cpu_distance.ns = 60;
  EXPECT_EQ(result_of(run_checks(input), "cores").verdict, Verdict::kPass);
  DoctorInput one_thread_each = input_for(tiny(2, 1), false);
  one_thread_each.machine.cpu_distance.ns = 320;
  EXPECT_EQ(result_of(run_checks(one_thread_each), "cores").verdict, Verdict::kPass);
}

TEST(Doctor, AModelLargerThanTheMemoryFailsMemory) {
  DoctorInput input = input_for(tiny(2, 1), false);
  input.machine.available_memory_bytes = 1 << 20;
  const std::vector<CheckResult> results = run_checks(input);
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"memory"})
      << all_text(results);
  EXPECT_GT(result_of(results, "memory").figures.at("predicted_bytes").get<int64_t>(), 1 << 20);
}

TEST(Doctor, RecomputeThatChangesTheGradientsFailsRecompute) {
  TrainConfig config = tiny(1, 2);
  config.parallel.recompute = Recompute::kSelective;
  // The run without recompute is nudged after its last step, as a recompute that replayed a
  // collective twice would leave it: the two runs no longer agree bit for bit.
  ProbeOptions options{.after_toggled_step = [](LayoutRunRank& rank) {
    if (rank.step == 2) rank.trainer.model().parameters().master().data<float>()[0] += 1e-3f;
  }};
  const std::vector<CheckResult> results = run_checks(input_for(config, true, options));
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"recompute"})
      << all_text(results);
  EXPECT_NE(result_of(results, "recompute").saw.find("differs after the steps"), std::string::npos);
}

TEST(Doctor, AReplicaThatDivergesFailsReplicasNamingTheParameterAndRanks) {
  ProbeOptions options{.after_layout_step = [](LayoutRunRank& rank) {
    if (rank.step == 2 && rank.at.dp == 1) {
      rank.trainer.model().parameters().master().data<float>()[0] += 1.0f;
    }
  }};
  const std::vector<CheckResult> results = run_checks(input_for(tiny(2, 1), true, options));
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"replicas"})
      << all_text(results);
  const CheckResult& r = result_of(results, "replicas");
  EXPECT_NE(r.saw.find("'transformer.wte.weight' differs between dp rank 0 and dp rank 1"),
            std::string::npos)
      << r.saw;
}

// Under expert parallelism (dp 4, ep 2, ZeRO-1) the dp ranks hold other experts in the same
// places: each parameter is compared with the lowest dp rank holding it, so a healthy run passes
// and a drift of rank 3's first expert (held also by rank 1) fails naming those two.
TEST(Doctor, ExpertReplicasAreComparedWithTheRanksHoldingTheSameExperts) {
  TrainConfig config = tiny(4, 1);
  config.model = model_preset("mixtral-tiny");
  config.parallel.ep = 2;
  config.parallel.zero = 1;
  const std::vector<CheckResult> healthy = run_checks(input_for(config, true));
  EXPECT_EQ(result_of(healthy, "replicas").verdict, Verdict::kPass) << all_text(healthy);
  ProbeOptions options{.after_layout_step = [](LayoutRunRank& rank) {
    if (rank.step != 2 || rank.at.dp != 3) return;
    const ParameterRegistry& registry = rank.trainer.model().registry();
    const int index = registry.find("model.layers.0.block_sparse_moe.experts.2.w1.weight");
    ASSERT_GE(index, 0);
    rank.trainer.model().parameters().master().data<float>()[registry.at(index).offset] += 1.0f;
  }};
  const std::vector<CheckResult> results = run_checks(input_for(config, true, options));
  const CheckResult& r = result_of(results, "replicas");
  EXPECT_EQ(r.verdict, Verdict::kFail) << all_text(results);
  EXPECT_NE(r.saw.find("'model.layers.0.block_sparse_moe.experts.2.w1.weight' differs between "
                       "dp rank 1 and dp rank 3"),
            std::string::npos)
      << r.saw;
}

TEST(Doctor, ResumingWithAnotherGlobalBatchFailsBatchAndSaysTheLrWasNotRescaled) {
  TrainConfig config = tiny(1, 1);
  config.seq_len = 32;
  config.resolve_batch(1);
  const fs::path dir = saved_checkpoint(testing::scratch_dir("doctor_batch"), config, 32, 1);

  DoctorInput same = input_for(config, false);
  same.resume_from = dir;
  EXPECT_EQ(result_of(run_checks(same), "batch").verdict, Verdict::kPass)
      << result_of(run_checks(same), "batch").saw;

  TrainConfig doubled = config;
  doubled.micro_batches = 2;
  doubled.global_batch = 0;
  DoctorInput changed = input_for(doubled, false);
  changed.resume_from = dir;
  const std::vector<CheckResult> results = run_checks(changed);
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"batch"})
      << all_text(results);
  const CheckResult& r = result_of(results, "batch");
  EXPECT_NE(r.saw.find("batch.global_batch: saved 2, now 4"), std::string::npos) << r.saw;
  EXPECT_NE(r.saw.find("the LR was not rescaled"), std::string::npos) << r.saw;
  EXPECT_NE(r.fix.find("--set batch.global_batch=2"), std::string::npos) << r.fix;
}

TEST(Doctor, ACorruptedCheckpointOrOneOfAnotherModelFailsCheckpoint) {
  TrainConfig config = tiny(1, 1);
  config.seq_len = 16;
  config.resolve_batch(1);
  const fs::path dir = saved_checkpoint(testing::scratch_dir("doctor_checkpoint"), config, 16, 2);
  DoctorInput input = input_for(config, false);
  input.resume_from = dir;
  EXPECT_EQ(result_of(run_checks(input), "checkpoint").verdict, Verdict::kPass);

  TrainConfig other = config;  // another width: every matrix has another shape
  other.model.d_model = 128;
  DoctorInput mismatched = input_for(other, false);
  mismatched.resume_from = dir;
  std::vector<CheckResult> results = run_checks(mismatched);
  EXPECT_EQ(result_of(results, "checkpoint").verdict, Verdict::kFail);
  EXPECT_NE(result_of(results, "checkpoint").saw.find("of another shape or dtype"),
            std::string::npos)
      << result_of(results, "checkpoint").saw;

  {  // one byte of the shard file flipped
    std::fstream file(dir / "rank_00000.safetensors",
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-8, std::ios::end);
    char byte = 0;
    file.read(&byte, 1);
    file.seekp(-8, std::ios::end);
    byte = char(byte ^ 0x40);
    file.write(&byte, 1);
  }
  results = run_checks(input);
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"checkpoint"})
      << all_text(results);
  EXPECT_NE(result_of(results, "checkpoint").saw.find("CRC32C"), std::string::npos)
      << result_of(results, "checkpoint").saw;
}

TEST(Doctor, HeadsThatDoNotSplitOverTpFailAttention) {
  const std::vector<CheckResult> results = run_checks(input_for(tiny(1, 3), false));
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"attention-tp"})
      << all_text(results);
}

TEST(Doctor, AShardedStateThatKeepsAWholeCopyFailsSharding) {
  TrainConfig config = tiny(2, 1);
  config.parallel.zero = 1;
  // A whole copy of the moments left on every rank, as an optimizer that did not shard would.
  ProbeOptions options{.after_layout_step = [](LayoutRunRank& rank) {
    if (rank.step != 2) return;
    const int64_t whole = rank.trainer.model().registry().total_elements();
    rank.held.push_back(
        Tensor::zeros(rank.arena, Shape{2 * whole}, DType::kF32, MemoryCategory::kOptimizerState));
  }};
  const std::vector<CheckResult> results = run_checks(input_for(config, true, options));
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"sharding"})
      << all_text(results);
  EXPECT_NE(result_of(results, "sharding").saw.find("the optimizer state is not sharded"),
            std::string::npos);
}

TEST(Doctor, AnOutputDirThatCannotBeWrittenFailsAndLeftoversWarnCheckpointDir) {
  const fs::path scratch = testing::scratch_dir("doctor_ckpt");
  std::ofstream(scratch / "a_file") << "x";
  TrainConfig config = tiny(1, 1);
  config.out_dir = (scratch / "a_file" / "run").string();
  std::vector<CheckResult> results = run_checks(input_for(config, false));
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"checkpoint-dir"})
      << all_text(results);

  config.out_dir = (scratch / "run").string();
  fs::create_directories(scratch / "run" / "checkpoints" / "step_4.tmp");
  results = run_checks(input_for(config, false));
  EXPECT_EQ(with_verdict(results, Verdict::kWarn), std::set<std::string>{"checkpoint-dir"})
      << all_text(results);
  EXPECT_NE(result_of(results, "checkpoint-dir").saw.find("step_4.tmp"), std::string::npos);
}

TEST(Doctor, WeightsOfAnotherShapeOrAnExtraTensorFailDtypeLoadAndBf16WeightsWidenExactly) {
  const fs::path scratch = testing::scratch_dir("doctor_init_from");
  TrainConfig config = tiny(1, 1);
  Arena arena("export");
  Transformer model(config.model, arena, DType::kBF16);
  model.initialize(3);
  export_hf(scratch / "hf", model);
  DoctorInput input = input_for(config, false);
  input.init_from = scratch / "hf";
  std::vector<CheckResult> results = run_checks(input);
  EXPECT_EQ(result_of(results, "dtype-load").verdict, Verdict::kPass) << all_text(results);
  EXPECT_EQ(result_of(results, "dtype-load").figures.at("exact"),
            int64_t(model.registry().specs().size()));

  // The bf16 compute copy under Hugging Face names, plus one tensor the model does not have.
  SafetensorsWriter writer;
  const auto& specs = model.registry().specs();
  for (int i = 0; i < int(specs.size()); ++i) {
    writer.add(specs[size_t(i)].name, model.parameters().compute(i));
  }
  writer.write(scratch / "bf16.safetensors");
  input.init_from = scratch / "bf16.safetensors";
  results = run_checks(input);
  EXPECT_EQ(result_of(results, "dtype-load").verdict, Verdict::kPass) << all_text(results);
  EXPECT_NE(result_of(results, "dtype-load").saw.find("widened exactly"), std::string::npos);
  writer.add("transformer.h.7.mlp.c_fc.weight", model.parameters().compute(0));
  writer.write(scratch / "extra.safetensors");
  input.init_from = scratch / "extra.safetensors";
  results = run_checks(input);
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"dtype-load"})
      << all_text(results);
  EXPECT_NE(result_of(results, "dtype-load").saw.find("unexpected transformer.h.7.mlp.c_fc"),
            std::string::npos)
      << result_of(results, "dtype-load").saw;

  TrainConfig wider = config;  // another architecture: config.json says so, tensor by tensor too
  wider.model.d_model = 128;
  input = input_for(wider, false);
  input.init_from = scratch / "bf16.safetensors";
  results = run_checks(input);
  EXPECT_EQ(result_of(results, "dtype-load").verdict, Verdict::kFail);
  EXPECT_NE(result_of(results, "dtype-load").saw.find("mis-shaped"), std::string::npos)
      << result_of(results, "dtype-load").saw;
}

TEST(Doctor, AGradNormThatIsNotTheOneRanksFailsGradNorm) {
  // Every rank of the layout scales its weights after the first step (the replicas stay equal,
  // the first loss is the one-rank run's): from step 2 the clip sees another norm.
  ProbeOptions options{.after_layout_step = [](LayoutRunRank& rank) {
    if (rank.step != 0) return;
    ParameterStore& store = rank.trainer.model().parameters();
    float* master = store.master().data<float>();
    for (int64_t i = 0; i < store.master().numel(); ++i) master[i] *= 1.05f;
    store.refresh_compute_copy();
  }};
  const std::vector<CheckResult> results = run_checks(input_for(tiny(2, 2), true, options));
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"grad-norm"})
      << all_text(results);
  EXPECT_NE(result_of(results, "grad-norm").saw.find("step 2"), std::string::npos);
}

TEST(Doctor, ABucketHoldingEveryGradientWarnsOverlap) {
  TrainConfig config = tiny(2, 1);
  config.model.d_model = 256;  // about 38 MB of gradients: worth overlapping
  config.model.n_layer = 12;
  config.parallel.bucket_mb = 64;  // a single bucket
  const std::vector<CheckResult> results = run_checks(input_for(config, true));
  EXPECT_EQ(with_verdict(results, Verdict::kWarn), std::set<std::string>{"overlap"})
      << all_text(results);
  const CheckResult& r = result_of(results, "overlap");
  EXPECT_NE(r.saw.find("one bucket"), std::string::npos) << r.saw;
  EXPECT_NE(r.fix.find("--bucket-mb 2.3"), std::string::npos) << r.fix;
  // The probe's own buckets still started during backward: the mechanism works.
  EXPECT_EQ(r.figures.at("launched_during_backward"), r.figures.at("buckets"));
}

// Backward that reports no gradient ready: every bucket starts only when it has ended.
TEST(Doctor, GradientHooksThatNeverFireFailOverlap) {
  ProbeOptions options{.after_layout_step = [](LayoutRunRank& rank) {
    if (rank.step == 0) {
      LATTICE_CHECK(rank.trainer.config().parallel.zero <= 1);
      rank.trainer.set_gradient_overlap(false);
    }
  }};
  const std::vector<CheckResult> results = run_checks(input_for(tiny(2, 1), true, options));
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"overlap"})
      << all_text(results);
  const CheckResult& r = result_of(results, "overlap");
  EXPECT_NE(r.saw.find("gradient-ready hooks did not fire"), std::string::npos) << r.saw;
  EXPECT_EQ(r.figures.at("launched_during_backward"), 0);
}

// Pipeline sends are waited for at the end of the step: a healthy pipeline hides them behind
// compute; a stage whose sends reach the previous one 50 ms late waits for them itself.
TEST(Doctor, PipelineSendsTheNextStageTakesLateWarnOverlap) {
  TrainConfig config = tiny(1, 1, 2);
  config.micro_batches = 4;
  const CheckResult healthy = result_of(run_checks(input_for(config, true)), "overlap");
  EXPECT_EQ(healthy.verdict, Verdict::kPass) << healthy.saw;
  EXPECT_NE(healthy.saw.find("pipeline sends: rank"), std::string::npos) << healthy.saw;

  ::setenv("LATTICE_SLOW_LINK", "1:0:50", 1);  // stage 1's gradients reach stage 0 50 ms late
  const DoctorInput slowed = input_for(config, true);
  ::unsetenv("LATTICE_SLOW_LINK");
  const CheckResult r = result_of(run_checks(slowed), "overlap");
  EXPECT_EQ(r.verdict, Verdict::kWarn) << r.saw;
  EXPECT_EQ(r.figures.at("pipeline_sends_rank"), 1) << r.saw;
  EXPECT_GT(r.figures.at("pipeline_send_wait_s").get<double>(), 0.04) << r.saw;
  EXPECT_NE(r.saw.find("the next stage takes them late"), std::string::npos) << r.saw;
  EXPECT_NE(r.fix.find("layers_per_chunk"), std::string::npos) << r.fix;
}

TEST(Doctor, ASlowLinkWarnsNetwork) {
  ::setenv("LATTICE_SLOW_LINK", "0:1:50", 1);  // every message from rank 0 to 1 waits 50 ms
  const DoctorInput input = input_for(tiny(2, 1), true);
  ::unsetenv("LATTICE_SLOW_LINK");
  const std::vector<CheckResult> results = run_checks(input);
  const CheckResult& r = result_of(results, "network");
  EXPECT_EQ(r.verdict, Verdict::kWarn) << all_text(results);
  EXPECT_NE(r.saw.find("dp[pp0·tp0] all_reduce"), std::string::npos) << r.saw;
  EXPECT_GT(r.figures.at("measured_s").get<double>(), 0.1);  // two messages of 50 ms a call
}

// `ethtool -S` of a NIC whose pause counters rose: a fake ethtool over a fake sysfs tree.
TEST(Doctor, NicPauseFramesDuringTheProbeWarnNetwork) {
  const fs::path scratch = testing::scratch_dir("doctor_ethtool");
  fs::create_directories(scratch / "net" / "eth7" / "device");
  fs::create_directories(scratch / "net" / "veth0");  // virtual: no device/, not read
  const fs::path ethtool = scratch / "ethtool";
  std::ofstream(ethtool) << "#!/bin/sh\n"
                         << "echo 'NIC statistics:'\n"
                         << "echo '     rx_packets: 991'\n"
                         << "echo '     rx_pause_ctrl_phy: 12'\n"
                         << "echo '     tx_prio3_pause: 4'\n"
                         << "echo '     rx_prio3_pause_duration: 800'\n";
  fs::permissions(ethtool, fs::perms::owner_all);
  const std::map<std::string, int64_t> read = read_pause_frames(ethtool, scratch / "net");
  EXPECT_EQ(read, (std::map<std::string, int64_t>{{"eth7/rx_pause_ctrl_phy", 12},
                                                  {"eth7/tx_prio3_pause", 4}}));
  EXPECT_TRUE(read_pause_frames(scratch / "absent", scratch / "net").empty());
  EXPECT_EQ(
      counter_deltas({{"eth7/rx_pause_ctrl_phy", 2}}, read),
      (std::map<std::string, int64_t>{{"eth7/rx_pause_ctrl_phy", 10}, {"eth7/tx_prio3_pause", 4}}));

  DoctorInput input = input_for(tiny(2, 1), false);
  input.pause_frames_during_probe = {{"eth7/rx_pause_ctrl_phy", 0}};
  EXPECT_NE(result_of(run_checks(input), "network").verdict, Verdict::kWarn);
  input.pause_frames_during_probe = {{"eth7/rx_pause_ctrl_phy", 10}};
  const std::vector<CheckResult> results = run_checks(input);
  EXPECT_EQ(with_verdict(results, Verdict::kWarn), std::set<std::string>{"network"});
  EXPECT_NE(result_of(results, "network").saw.find("eth7/rx_pause_ctrl_phy +10"),
            std::string::npos);
}

TEST(Doctor, RdmaPortsThatWaitedForCreditWarnNetwork) {
  const fs::path sys = testing::scratch_dir("doctor_sysfs");
  const fs::path counters = sys / "mlx5_0" / "ports" / "1" / "counters";
  fs::create_directories(counters);
  std::ofstream(counters / "port_xmit_wait") << 1200 << "\n";
  EXPECT_EQ(read_port_xmit_wait(sys), (std::map<std::string, int64_t>{{"mlx5_0/1", 1200}}));
  EXPECT_TRUE(read_port_xmit_wait(sys / "absent").empty());

  DoctorInput input = input_for(tiny(2, 1), false);
  input.port_xmit_wait_during_probe = {{"mlx5_0/1", 0}};
  EXPECT_NE(result_of(run_checks(input), "network").verdict, Verdict::kWarn);
  input.port_xmit_wait_during_probe = {{"mlx5_0/1", 35}};
  const std::vector<CheckResult> results = run_checks(input);
  EXPECT_EQ(with_verdict(results, Verdict::kWarn), std::set<std::string>{"network"});
  EXPECT_NE(result_of(results, "network").saw.find("mlx5_0/1 (35 waits)"), std::string::npos);
}

TEST(Doctor, ChecksThatNeedTheProbeSayNotApplicableWithoutIt) {
  TrainConfig config = tiny(2, 2);
  config.parallel.zero = 1;
  config.parallel.recompute = Recompute::kFull;
  const std::vector<CheckResult> results = run_checks(input_for(config, false));
  for (const DoctorCheck& check : doctor_checks()) {
    if (!check.needs_probe) continue;
    const CheckResult& r = result_of(results, std::string(check.id));
    EXPECT_EQ(r.verdict, Verdict::kNotApplicable) << r.id;
    EXPECT_NE(r.saw.find("needs the probe"), std::string::npos) << r.saw;
  }
}

TEST(Doctor, TheJsonOfACheckHasTheStableFields) {
  const std::vector<CheckResult> results = run_checks(input_for(tiny(1, 1), false));
  for (const CheckResult& r : results) {
    const nlohmann::json j = to_json(r);
    for (const char* field : {"id", "title", "verdict", "saw", "fix", "figures"}) {
      EXPECT_TRUE(j.contains(field)) << field;
    }
    EXPECT_TRUE(j.at("figures").is_object());
  }
  EXPECT_EQ(to_json(result_of(results, "batch")).at("figures").at("global_batch"), 2);
}

}  // namespace
}  // namespace lattice::doctor
