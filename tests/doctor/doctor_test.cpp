// The doctor's checks (issue: "one test each that creates the condition and expects the doctor
// to name it"): a healthy layout passes every check; each condition, created in the config, the
// machine's description, the files, or the probe's real run (its test hooks), fails or warns
// exactly the check that names it.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "ckpt/trainer_checkpoint.h"
#include "doctor/doctor.h"
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
          .omp_num_threads = std::nullopt};
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

std::string all_text(const std::vector<CheckResult>& results) {
  return format_results(results);
}

TEST(Doctor, AHealthyLayoutPassesEveryCheck) {
  TrainConfig config = tiny(2, 2);
  config.parallel.zero = 1;
  config.parallel.recompute = Recompute::kSelective;
  config.out_dir = testing::scratch_dir("doctor_healthy").string();
  const std::vector<CheckResult> results = run_checks(input_for(config, true));
  EXPECT_TRUE(with_verdict(results, Verdict::kFail).empty()) << all_text(results);
  EXPECT_TRUE(with_verdict(results, Verdict::kWarn).empty()) << all_text(results);
  // With dp, tp, ZeRO-1, recompute and an output directory every check applies.
  EXPECT_TRUE(with_verdict(results, Verdict::kNotApplicable).empty()) << all_text(results);
  EXPECT_EQ(results.size(), doctor_checks().size());
}

TEST(Doctor, ACollectiveDeadlineShorterThanTheStepFailsTimeouts) {
  TrainConfig config = tiny(2, 1);
  config.parallel.timeout_s = 1e-7;
  const std::vector<CheckResult> results = run_checks(input_for(config, true));
  EXPECT_EQ(with_verdict(results, Verdict::kFail), std::set<std::string>{"timeouts"})
      << all_text(results);
  EXPECT_NE(result_of(results, "timeouts").fix.find("parallel.timeout_s="), std::string::npos);
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

TEST(Doctor, ResumingWithAnotherGlobalBatchFailsBatchAndSaysTheLrWasNotRescaled) {
  const fs::path root = testing::scratch_dir("doctor_batch");
  TrainConfig config = tiny(1, 1);
  config.seq_len = 32;
  config.resolve_batch(1);
  Arena arena("save");
  Trainer trainer(config, arena, {},
                  {.train = random_token_file(config.global_batch, 32, config.model.vocab_size, 1),
                   .val = nullptr});
  trainer.train_step();
  const fs::path dir = save_trainer_checkpoint(root, trainer, nullptr);

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
