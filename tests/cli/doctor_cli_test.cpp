// `lattice doctor` and `lattice train --preflight` through the executable: a healthy layout
// passes every check with exit 0, a created condition fails exactly its check with exit 1, the
// --json lines parse with the stable fields, and a failing preflight starts no rank.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "cli/cli_run.h"
#include "cli/tiny_run.h"
#include "core/thread_budget.h"
#include "support/scratch_dir.h"
#include "train/test_corpus.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 120;
const std::string kTinyConfig = LATTICE_SOURCE_DIR "/configs/gpt2-tiny.toml";

std::vector<std::string> doctor(std::vector<std::string> extra) {
  std::vector<std::string> args = {LATTICE_EXECUTABLE, "doctor", kTinyConfig};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// check id -> verdict, from --json output (one object per line).
std::map<std::string, std::string> verdicts(const std::string& out) {
  std::map<std::string, std::string> by_id;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    for (const char* field : {"id", "title", "verdict", "saw", "fix", "figures"}) {
      EXPECT_TRUE(j.contains(field)) << field << " in " << line;
    }
    by_id[j.at("id").get<std::string>()] = j.at("verdict").get<std::string>();
  }
  return by_id;
}

TEST(DoctorCli, AHealthyLayoutPassesEveryCheckAndExitsZero) {
  // dp 2 × tp 2 is four in-process ranks: on a machine of fewer cores the run needs
  // --oversubscribe, which the doctor then only warns about.
  const CliResult r = run_cli(doctor({"--dp", "2", "--tp", "2", "--zero", "1", "--recompute",
                                      "selective", "--oversubscribe", "--json"}),
                              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const std::map<std::string, std::string> by_id = verdicts(r.out);
  EXPECT_EQ(by_id.size(), 15u) << r.out;
  for (const auto& [id, verdict] : by_id) {
    if (id == "cores" && verdict == "WARN") continue;    // a small machine, --oversubscribe
    if (id == "network" && verdict == "WARN") continue;  // collective times on a loaded machine
    if (id == "gemm-library" && verdict == "WARN") continue;  // this machine's libraries
    EXPECT_TRUE(verdict == "PASS" || verdict == "N/A") << id << ": " << verdict << "\n" << r.out;
  }
  for (const char* id : {"recompute", "replicas", "sharding", "grad-norm", "attention-tp"}) {
    EXPECT_EQ(by_id.at(id), "PASS") << id << "\n" << r.out;
  }
  // The GEMM library check timed the run's GEMM in every library the build has.
  {
    std::istringstream lines(r.out);
    bool timed = false;
    for (std::string line; std::getline(lines, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.at("id") != "gemm-library") continue;
      timed = j.at("figures").at("onednn_gflops").get<double>() > 0;
#if defined(LATTICE_HAVE_MKL)
      EXPECT_GT(j.at("figures").at("mkl_gflops").get<double>(), 0.0) << line;
#endif
    }
    EXPECT_TRUE(timed) << r.out;
  }
  // The cores check measured how far apart the machine's first two CPUs are.
  if (affinity_cpus().size() >= 2) {
    bool measured = false;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.at("id") != "cores") continue;
      measured = j.at("figures").at("cpu_round_trip_ns").get<double>() > 0;
    }
    EXPECT_TRUE(measured) << r.out;
  }
  // ... and reports the kernel's transparent huge pages mode, the one bracketed in sysfs.
  std::string sysfs_line;
  std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), sysfs_line);
  std::istringstream lines(r.out);
  bool reported = false;
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("id") != "cores") continue;
    reported = true;
    const std::string mode = j.at("figures").at("transparent_huge_pages");
    if (sysfs_line.empty()) {
      EXPECT_EQ(mode, "") << line;
    } else {
      EXPECT_NE(sysfs_line.find("[" + mode + "]"), std::string::npos) << sysfs_line << "\n" << line;
    }
  }
  EXPECT_TRUE(reported) << r.out;
}

TEST(DoctorCli, ADeadlineShorterThanTheStepFailsOnlyTimeoutsWithExitOne) {
  const CliResult r =
      run_cli(doctor({"--dp", "2", "--set", "parallel.timeout_s=0.0000001", "--json"}), kLimitS);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  for (const auto& [id, verdict] : verdicts(r.out)) {
    EXPECT_EQ(verdict == "FAIL", id == "timeouts") << id << ": " << verdict << "\n" << r.out;
  }
}

// A rank that does not arrive within the probe's deadline (the config's, at least 1 s): the
// probe fails naming it, in bounded time, and the other checks still run.
TEST(DoctorCli, AProbeRankThatDoesNotArriveIsNamed) {
  const CliResult r = run_cli(doctor({"--dp", "2", "--set", "parallel.timeout_s=1", "--json"}),
                              kLimitS, {"LATTICE_SLOW_LINK=0:1:3000"});
  EXPECT_EQ(r.exit_code, 1) << r.all();
  const std::map<std::string, std::string> by_id = verdicts(r.out);
  EXPECT_EQ(by_id.at("probe"), "FAIL") << r.out;
  // Rank 1 waits for rank 0's late messages (or rank 0 for rank 1's answer): either names the
  // other.
  EXPECT_NE(r.out.find("timed out after 1000 ms on rank"), std::string::npos) << r.out;
  EXPECT_TRUE(r.out.find("on rank 1: every rank arrived but rank 0, which this rank was "
                         "waiting on") != std::string::npos ||
              r.out.find("on rank 0: every rank arrived but rank 1, which this rank was "
                         "waiting on") != std::string::npos)
      << r.out;
  EXPECT_EQ(by_id.at("memory"), "PASS") << r.out;
}

TEST(DoctorCli, ASlowLinkWarnsNetworkAndOnlyNetwork) {
  const CliResult r =
      run_cli(doctor({"--dp", "2", "--json"}), kLimitS, {"LATTICE_SLOW_LINK=0:1:50"});
  EXPECT_EQ(r.exit_code, 0) << r.all();  // a warning is not a failure
  for (const auto& [id, verdict] : verdicts(r.out)) {
    if (id == "gemm-library") continue;  // this machine's libraries, not the link
    EXPECT_EQ(verdict == "WARN", id == "network") << id << ": " << verdict << "\n" << r.out;
  }
}

TEST(DoctorCli, TheTextReportNamesEachCheckAndItsFix) {
  const std::filesystem::path out = scratch_dir("doctor_cli_text") / "file";
  { std::ofstream(out) << "x"; }
  const CliResult r =
      run_cli(doctor({"--no-probe", "--set", "output.dir=" + (out / "run").string()}), kLimitS);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_NE(r.out.find("FAIL  Checkpoint directory (checkpoint-dir)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fix: --set output.dir=DIR"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("N/A   Diverging master weights (replicas)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("probe: not run (--no-probe)"), std::string::npos) << r.out;
}

TEST(PreflightCli, AFailingPreflightRefusesToStartAndNamesTheCheck) {
  const CliResult r = run_cli({LATTICE_EXECUTABLE, "train", kTinyConfig, "--preflight", "--tp", "3",
                               "--oversubscribe", "--set", "train.steps=2"},
                              kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();  // input refused
  EXPECT_NE(r.out.find("FAIL  Attention vs tensor parallelism (attention-tp)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.err.find("preflight: 1 check(s) failed (attention-tp)"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("| loss "), std::string::npos) << r.out;  // no step trained
}

TEST(DoctorCli, ACheckpointAloneIsCheckedAgainstTheModelItRecords) {
  const TinyRun run = train_tiny_run("doctor_cli_ckpt");
  ASSERT_EQ(run.result.exit_code, 0) << run.result.all();
  const std::string dir = run.final_dir.string();
  CliResult r = run_cli({LATTICE_EXECUTABLE, "doctor", "--ckpt", dir, "--json"}, kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(verdicts(r.out), (std::map<std::string, std::string>{{"checkpoint", "PASS"}}));
  r = run_cli({LATTICE_EXECUTABLE, "doctor", LATTICE_SOURCE_DIR "/configs/llama-tiny.toml",
               "--ckpt", dir, "--no-probe", "--json"},
              kLimitS);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_EQ(verdicts(r.out).at("checkpoint"), "FAIL") << r.out;
  ASSERT_FALSE(corrupt_a_tensor_file(run.final_dir).empty());
  r = run_cli({LATTICE_EXECUTABLE, "doctor", "--ckpt", dir}, kLimitS);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_NE(r.out.find("FAIL  Checkpoint against the config (checkpoint)"), std::string::npos)
      << r.out;
}

TEST(DoctorCli, EveryRankOfARunWritesItsMetricsAndTheRunChecksPass) {
  const auto data = make_corpus_dir("doctor_cli_run", 8000, 2000);
  const std::filesystem::path config = write_tiny_config(data, 6, "");
  const std::filesystem::path out = scratch_dir("doctor_cli_run_out");
  const CliResult trained = run_cli(train_args(config, out, {"--dp", "2"}), kLimitS);
  ASSERT_EQ(trained.exit_code, 0) << trained.all();
  EXPECT_NE(trained.out.find("per-rank metrics in"), std::string::npos) << trained.out;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(out / "metrics" / ("rank_0000" + std::to_string(rank) + ".jsonl"));
    int steps = 0;
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      EXPECT_EQ(j.at("step"), ++steps);
      EXPECT_EQ(j.at("rank"), rank);
      EXPECT_EQ(j.at("at").at("dp"), rank);
      EXPECT_GT(j.at("parts").at("backward_ms").get<double>(), 0.0);
      EXPECT_GT(j.at("memory").at("live").at("optimizer_state").get<int64_t>(), 0);
      // The dp group's gradient all-reduces of this step, with their bandwidth.
      bool reduced = false;
      for (const nlohmann::json& c : j.at("comm")) {
        reduced |= c.at("collective") == "all_reduce" && c.at("group") == "dp[pp0·tp0]" &&
                   c.at("busbw").get<double>() > 0;
      }
      EXPECT_TRUE(reduced) << line;
    }
    EXPECT_EQ(steps, 6);
  }
  const CliResult r =
      run_cli({LATTICE_EXECUTABLE, "doctor", "--run", out.string(), "--json"}, kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const std::map<std::string, std::string> by_id = verdicts(r.out);
  EXPECT_EQ(by_id.size(), 6u) << r.out;
  EXPECT_EQ(by_id.at("run-loss"), "PASS") << r.out;
  EXPECT_EQ(by_id.at("run-bubble"), "N/A") << r.out;   // dp only
  EXPECT_EQ(by_id.at("run-experts"), "N/A") << r.out;  // a dense model
}

// A traced pipeline run: its stages' bubbles, read from the traces run.json names, are the
// schedule's.
TEST(DoctorCli, ATracedPipelineRunsBubbleIsJudgedAgainstItsSchedule) {
  const auto data = make_corpus_dir("doctor_run_pp", 8000, 2000);
  const auto config = write_tiny_config(data, 3, "");
  const auto out = scratch_dir("doctor_run_pp_out");
  const CliResult trained = run_cli(train_args(config, out,
                                               {"--pp", "2", "--set", "batch.micro_batches=4",
                                                "--trace", (out / "trace").string()}),
                                    kLimitS);
  ASSERT_EQ(trained.exit_code, 0) << trained.all();
  const CliResult r = run_cli({LATTICE_EXECUTABLE, "doctor", "--run", out.string()}, kLimitS);
  EXPECT_NE(r.out.find("(run-bubble)"), std::string::npos) << r.all();
  EXPECT_NE(r.out.find("against the 1f1b schedule's: rank 0 (stage 0)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("vs 20.0%, rank 1 (stage 1)"), std::string::npos) << r.out;
}

TEST(DoctorCli, UnderMpirunEveryRankReportsAndUnboundRanksFailAffinity) {
  auto env_doctor = [](const std::string& binding) {
    return run_cli(
        {LATTICE_MPIEXEC, "-np", "2", "--oversubscribe", "--allow-run-as-root", "--bind-to",
         binding, LATTICE_EXECUTABLE, "doctor", "--env", "--threads", "1", "--json"},
        kLimitS);
  };
  const CliResult bound = env_doctor("core");
  ASSERT_EQ(bound.exit_code, 0) << bound.all();
  EXPECT_EQ(verdicts(bound.out).at("launcher"), "PASS") << bound.out;  // rank 0 prints, once
  EXPECT_EQ(verdicts(bound.out).at("affinity"), "PASS") << bound.out;
  const CliResult unbound = env_doctor("none");
  EXPECT_NE(unbound.exit_code, 0) << unbound.all();
  EXPECT_EQ(verdicts(unbound.out).at("affinity"), "FAIL") << unbound.out;
  EXPECT_NE(unbound.out.find("ranks 0 and 1"), std::string::npos) << unbound.out;
}

// Under lattice launch every rank process reports through the agent's Gloo world; the agent's
// --cores-per-rank gives each its own core, and a FAIL ends the job without a restart.
TEST(DoctorCli, UnderLatticeLaunchEveryRankReportsAndCoresPerRankBindsThem) {
  if (available_cores() < 2) GTEST_SKIP() << "needs 2 cores to give each rank its own";
  auto env_doctor = [](std::vector<std::string> binding) {
    std::vector<std::string> args = {LATTICE_EXECUTABLE, "launch", "--nproc-per-node", "2"};
    args.insert(args.end(), binding.begin(), binding.end());
    for (const char* a : {"--", "doctor", "--env", "--threads", "1", "--json"}) args.push_back(a);
    return run_cli(args, kLimitS);
  };
  // A check the output lacks reads "missing" (and the failure shows the output).
  auto verdict = [](const CliResult& r, const std::string& id) {
    const std::map<std::string, std::string> by_id = verdicts(r.out);
    return by_id.contains(id) ? by_id.at(id) : std::string("missing");
  };
  const CliResult bound = env_doctor({"--cores-per-rank", "1"});
  ASSERT_EQ(bound.exit_code, 0) << bound.all();
  EXPECT_EQ(verdict(bound, "launcher"), "PASS") << bound.all();  // the agent's ranks
  EXPECT_EQ(verdict(bound, "affinity"), "PASS") << bound.all();
  const CliResult unbound = env_doctor({});
  EXPECT_NE(unbound.exit_code, 0) << unbound.all();
  EXPECT_EQ(verdict(unbound, "affinity"), "FAIL") << unbound.all();
  EXPECT_NE(unbound.out.find("lattice launch --cores-per-rank T"), std::string::npos)
      << unbound.out;
  EXPECT_NE(unbound.err.find("so the job ends"), std::string::npos) << unbound.err;  // no restart
  const CliResult too_many = env_doctor({"--cores-per-rank", "64"});
  EXPECT_NE(too_many.exit_code, 0);
  EXPECT_NE(too_many.err.find("needs 128 cores"), std::string::npos) << too_many.all();
}

// A training run under lattice launch --cores-per-rank: each rank on its core, the losses those
// of the unbound run.
TEST(DoctorCli, ARunUnderCoresPerRankTrainsLikeTheUnboundOne) {
  if (available_cores() < 2) GTEST_SKIP() << "needs 2 cores to give each rank its own";
  const auto data = make_corpus_dir("launch_bound", 8000, 2000);
  const auto config = write_tiny_config(data, 3, "");
  auto launch = [&](const std::string& name, std::vector<std::string> binding) {
    const auto out = scratch_dir(name);
    std::vector<std::string> args = {LATTICE_EXECUTABLE, "launch", "--nproc-per-node", "2"};
    args.insert(args.end(), binding.begin(), binding.end());
    for (const std::string& a :
         {std::string("--"), std::string("train"), config.string(), std::string("--dp"),
          std::string("2"), std::string("--set"), "output.dir=" + out.string(),
          std::string("--set"), std::string("sample.tokens=0"), std::string("--set"),
          std::string("parallel.deterministic=true"), std::string("--metrics"),
          (out / "m.jsonl").string()}) {
      args.push_back(a);
    }
    const CliResult r = run_cli(args, kLimitS);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    return metric_values(out / "m.jsonl", "loss");
  };
  const std::vector<double> bound = launch("launch_bound_out", {"--cores-per-rank", "1"});
  const std::vector<double> unbound = launch("launch_unbound_out", {});
  ASSERT_EQ(bound.size(), 3u);
  EXPECT_EQ(bound, unbound);
}

}  // namespace
}  // namespace lattice::testing
