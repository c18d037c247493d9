// `lattice bench …` through the executable, each at the smallest size that still measures: the
// rows and the ratio columns it exists for, and a refused bad value each.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/tiny_run.h"
#include "comm/cost_model.h"
#include "core/cpu_peak.h"
#include "core/thread_budget.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 60;

std::vector<std::string> bench(std::vector<std::string> extra) {
  std::vector<std::string> args = {LATTICE_EXECUTABLE, "bench"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The whitespace-separated fields of each line of `text` that does not start with '#'.
std::vector<std::vector<std::string>> rows(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::vector<std::string> row;
    for (std::string f; fields >> f;) row.push_back(f);
    out.push_back(row);
  }
  return out;
}

// Pipeline: a row per schedule and micro-batch count, with the closed-form bubble and the
// simulator's, which agree under unit costs.
TEST(BenchCli, PipelinePrintsTheMeasuredBubbleNextToTheTheory) {
  const CliResult r = run_cli(bench({"pipeline", "--stages", "2", "--micro-batches", "2", "4",
                                     "--forward-ms", "1", "--steps", "1"}),
                              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  std::vector<std::vector<std::string>> table = rows(r.out);
  ASSERT_GE(table.size(), 2u) << r.out;
  table.erase(table.begin(), table.begin() + 2);  // the title and the column names
  // gpipe, 1f1b, interleaved-1f1b (v 2) and zb-h1, each at m = 2 and 4.
  ASSERT_EQ(table.size(), 8u) << r.out;
  for (const auto& row : table) {
    ASSERT_EQ(row.size(), 8u) << r.out;
    const double m = std::stod(row[1]), v = std::stod(row[2]);
    const double theory = 1.0 / (v * m) / (row[0] == "zb-h1" ? 3.0 : 1.0);  // (p - 1) / (v m)
    EXPECT_NEAR(std::stod(row[4]), theory, 1e-3) << row[0] << " m=" << row[1];
    EXPECT_NEAR(std::stod(row[6]), theory, 1e-3) << row[0] << " m=" << row[1];
    EXPECT_GE(std::stod(row[3]), 0.0) << row[0];  // measured idle / compute
  }
}

TEST(BenchCli, PipelineRefusesOneStage) {
  const CliResult r = run_cli(bench({"pipeline", "--stages", "1"}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("--stages: Value 1 not in range 2 to 16"), std::string::npos) << r.err;
}

// Tensor parallelism: tp 1 is the baseline (speed-up 1.00x, no collectives), tp 2 with and
// without sequence parallelism communicates, all from the same first loss.
TEST(BenchCli, TensorParallelPrintsTheSpeedUpOfEachLayoutOverTpOne) {
  const CliResult r = run_cli(bench({"tp", "--preset", "gpt2-tiny", "--batch", "1", "--seq", "16",
                                     "--steps", "1", "--warmup", "0", "--tp", "1,2"}),
                              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const std::vector<std::vector<std::string>> table = rows(r.out);
  ASSERT_EQ(table.size(), 3u) << r.out;
  EXPECT_EQ(table[0][0], "1");
  EXPECT_EQ(table[0][7], "1.00x") << r.out;
  EXPECT_EQ(table[0][10], "0") << r.out;  // calls/step
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(table[i][0], "2") << r.out;
    EXPECT_EQ(table[i][1], i == 1 ? "off" : "on") << r.out;
    EXPECT_TRUE(table[i][7].ends_with("x")) << r.out;
    EXPECT_GT(std::stoi(table[i][10]), 0) << r.out;
    EXPECT_EQ(table[i].back().substr(0, 6), table[0].back().substr(0, 6)) << r.out;  // loss
  }
}

// Context parallelism: cp 1 (the baseline of the run) and cp 2 on the same tokens: the same
// losses, ring traffic and its exposed share only at cp 2, and half the activation peak (a
// Llama: its q, k, v are buffers of their own at every cp, as the ring needs them).
TEST(BenchCli, ContextParallelPrintsTheExposedRingShareAndHalvesTheActivations) {
  const CliResult r = run_cli(bench({"cp", "--preset", "llama-tiny", "--batch", "1", "--seq", "256",
                                     "--steps", "1", "--warmup", "0", "--cp", "1,2"}),
                              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const std::vector<std::vector<std::string>> table = rows(r.out);
  ASSERT_EQ(table.size(), 2u) << r.out;
  EXPECT_EQ(table[0][0], "1");
  EXPECT_EQ(table[0][4], "1.00x") << r.out;
  EXPECT_EQ(table[0][8], "0.00") << r.out;  // MB/step: no ring at cp 1
  EXPECT_EQ(table[1][0], "2");
  EXPECT_TRUE(table[1][7].ends_with("%")) << r.out;
  EXPECT_GT(std::stod(table[1][8]), 0.0) << r.out;
  EXPECT_NEAR(std::stod(table[1][9]) / std::stod(table[0][9]), 0.5, 0.02) << r.out;
  EXPECT_EQ(table[1].back().substr(0, 6), table[0].back().substr(0, 6)) << r.out;  // loss

  const CliResult refused = run_cli(bench({"cp", "--seq", "100", "--cp", "1,4"}), kLimitS);
  EXPECT_EQ(refused.exit_code, 3) << refused.all();
  EXPECT_NE(refused.err.find("multiple of 8"), std::string::npos) << refused.err;
}

// Expert parallelism over the same 2 ranks: ep 1 (every rank holds every expert) the baseline,
// ep 2 sends rows by all-to-all, holds fewer parameters and computes the same losses.
TEST(BenchCli, MoePrintsTheAllToAllShareAndSpreadsTheExperts) {
  const CliResult r = run_cli(bench({"moe", "--batch", "4", "--seq", "64", "--steps", "1",
                                     "--warmup", "0", "--dp", "2", "--ep", "1,2"}),
                              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const std::vector<std::vector<std::string>> table = rows(r.out);
  ASSERT_EQ(table.size(), 2u) << r.out;
  EXPECT_EQ(table[0][0], "1");
  EXPECT_EQ(table[0][4], "1.00x") << r.out;
  EXPECT_EQ(table[0][7], "0.00") << r.out;  // MB/step: nothing exchanged at ep 1
  EXPECT_EQ(table[1][0], "2");
  EXPECT_TRUE(table[1][6].ends_with("%")) << r.out;
  EXPECT_GT(std::stod(table[1][7]), 0.0) << r.out;
  EXPECT_LT(std::stod(table[1][8]), std::stod(table[0][8])) << r.out;  // params MiB
  EXPECT_EQ(table[1].back(), table[0].back()) << r.out;                // losses

  const CliResult refused = run_cli(bench({"moe", "--dp", "2", "--ep", "1,3"}), kLimitS);
  EXPECT_EQ(refused.exit_code, 3) << refused.all();
  EXPECT_NE(refused.err.find("--ep 3 must divide"), std::string::npos) << refused.err;
}

TEST(BenchCli, TensorParallelRefusesASequenceLongerThanTheModel) {
  const CliResult r =
      run_cli(bench({"tp", "--preset", "gpt2-tiny", "--seq", "256", "--tp", "1"}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("seq 256 is longer than the model's context 64"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("HINT: pass a smaller --seq"), std::string::npos) << r.err;
}

// Training throughput against the GEMM ceiling of the same run.
TEST(BenchCli, TrainPrintsTheFractionOfTheGemmCeiling) {
  const CliResult r =
      run_cli(bench({"train", "--preset", "gpt2-tiny", "--batch", "1", "--seq", "16", "--steps",
                     "1", "--warmup", "0", "--threads", "1", "--precision", "fp32",
                     "--ceiling-shape", "64,64,64", "--gemm-repeats", "1"}),
              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("# baseline (same run): bf16 lattice::matmul M=64 K=64 N=64, best of 1, in "
                       "each GEMM library; %ceiling is against the fastest"),
            std::string::npos)
      << r.out;
  // The ceiling in every library the build has, each named.
  EXPECT_NE(r.out.find("#   1 thread(s): "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" GFLOP/s (oneDNN "), std::string::npos) << r.out;
#if defined(LATTICE_HAVE_MKL)
  EXPECT_NE(r.out.find(" GFLOP/s (oneMKL 20"), std::string::npos) << r.out;
#endif
  EXPECT_NE(r.out.find("(N = 120576 parameters"), std::string::npos) << r.out;
  // The machine at start and end: the load, and on two CPUs or more how far apart the host put
  // the first two (core/core_latency.h).
  for (const char* when :
       {"# machine at start: load average ", "# machine at end: load average "}) {
    const size_t line = r.out.find(when);
    ASSERT_NE(line, std::string::npos) << r.out;
    if (affinity_cpus().size() >= 2) {
      const std::string text = r.out.substr(line, r.out.find('\n', line) - line);
      EXPECT_NE(text.find(" ns apart (a cache line's round trip)"), std::string::npos) << text;
    }
  }
  // The cores' own bf16 peak and whether AMX is there, as this CPU reports them.
  const std::string peak = has_avx512_bf16() ? " GFLOP/s per core (VDPBF16PS); AMX-BF16: "
                                             : "no AVX512-BF16 on this CPU; AMX-BF16: ";
  EXPECT_NE(r.out.find("# bf16 arithmetic peak, measured: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(peak + (has_amx_bf16() ? "present" : "absent on this CPU")),
            std::string::npos)
      << r.out;
  const std::vector<std::vector<std::string>> table = rows(r.out);
  ASSERT_EQ(table.size(), 1u) << r.out;
  ASSERT_EQ(table[0].size(), 10u) << r.out;
  EXPECT_EQ(table[0][0], "fp32");
  EXPECT_EQ(table[0][9], "onednn") << r.out;  // the GEMM library of the row, the default
  EXPECT_TRUE(table[0][7].ends_with("%")) << r.out;
  EXPECT_GT(std::stod(table[0][7]), 0.0) << r.out;
}

// --profile: the step split into its kernels, every GEMM by role, the shares adding up to the
// step with what no kernel holds.
TEST(BenchCli, TrainProfileSplitsTheStepIntoItsKernels) {
  const CliResult r = run_cli(
      bench({"train", "--preset",    "gpt2-tiny", "--batch",         "2",        "--seq",
             "16",    "--steps",     "2",         "--warmup",        "1",        "--threads",
             "1",     "--precision", "fp32",      "--ceiling-shape", "64,64,64", "--gemm-repeats",
             "1",     "--profile"}),
      kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("# profile roof: memcpy of 256 MiB"), std::string::npos) << r.out;
  std::map<std::string, std::pair<double, double>> kernels;  // name -> (calls/step, share %)
  std::map<std::string, double> versus_alone;  // GEMM role -> its rate against the same alone, %
  double other_share = -1;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("#   ") || line.find("kernel ") != std::string::npos) continue;
    const size_t first_digit = line.find_first_of("0123456789", 4);
    if (line.starts_with("#   other")) {
      std::istringstream fields(line.substr(9));
      double ms = 0;
      std::string share;
      fields >> ms >> share;
      other_share = std::stod(share);
      continue;
    }
    if (first_digit == std::string::npos) continue;
    std::string name = line.substr(4, first_digit - 4);
    name.erase(name.find_last_not_of(' ') + 1);
    std::istringstream fields(line.substr(first_digit));
    double calls = 0, ms = 0, rate = 0, alone = 0;
    std::string share, unit, roof, versus;
    fields >> calls >> ms >> share >> rate >> unit >> roof;
    if (share.ends_with("%")) kernels[name] = {calls, std::stod(share)};
    if (fields >> alone >> versus) versus_alone[name] = std::stod(versus);
  }
  for (const char* name : {"gemm attn.c_attn fwd",
                           "gemm attn.c_attn dx",
                           "gemm attn.c_attn dw",
                           "gemm attn.c_proj fwd",
                           "gemm mlp.c_fc fwd",
                           "gemm mlp.c_proj dw",
                           "gemm lm_head fwd",
                           "gemm lm_head dx",
                           "gemm lm_head dw",
                           "attention fwd",
                           "attention bwd",
                           "layernorm fwd",
                           "layernorm bwd",
                           "gelu fwd",
                           "gelu bwd",
                           "cross-entropy fwd",
                           "cross-entropy bwd",
                           "adamw",
                           "embedding fwd",
                           "embedding bwd"}) {
    EXPECT_TRUE(kernels.contains(name)) << name << "\n" << r.out;
  }
  EXPECT_EQ(kernels["gemm attn.c_attn fwd"].first, 2.0);  // one per layer of gpt2-tiny
  EXPECT_EQ(kernels["gemm lm_head fwd"].first, 1.0);
  EXPECT_FALSE(kernels.contains("gemm (other)")) << r.out;  // every GEMM of the step has a role
  // GPT-2's attention reads q, k and v in the fused projection: no split or concat passes.
  EXPECT_FALSE(kernels.contains("split (copy)")) << r.out;
  EXPECT_FALSE(kernels.contains("concat (copy)")) << r.out;
  double shares = other_share;
  for (const auto& [name, k] : kernels) shares += k.second;
  EXPECT_GE(other_share, 0.0) << r.out;
  EXPECT_NEAR(shares, 100.0, 1.0) << r.out;
  // Every GEMM role is timed again alone, problem by problem; attention's own tiles are not.
  for (const auto& [name, k] : kernels) {
    if (name.starts_with("gemm ")) {
      ASSERT_TRUE(versus_alone.contains(name)) << name << "\n" << r.out;
      EXPECT_GT(versus_alone[name], 0.0) << name;
    }
  }
  EXPECT_FALSE(versus_alone.contains("attention fwd")) << r.out;
  EXPECT_NE(r.out.find("# the step's GEMMs (oneDNN "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of the same problems' rate alone in the fastest library"),
            std::string::npos)
      << r.out;
  // And each role's problems, one key=value line each, for another library to be posed them.
  for (const auto& [name, k] : kernels) {
    if (!name.starts_with("gemm ")) continue;
    const std::string line = "# gemm-problem role=\"" + name + "\" m=";
    const size_t at = r.out.find(line);
    ASSERT_NE(at, std::string::npos) << name << "\n" << r.out;
    const std::string rest = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_NE(rest.find(" calls_per_step="), std::string::npos) << rest;
    const size_t rate = rest.find(" alone_gflops=");
    ASSERT_NE(rate, std::string::npos) << rest;
    EXPECT_GT(std::stod(rest.substr(rate + 14)), 0.0) << rest;
  }
}

#if defined(LATTICE_HAVE_MKL)
// --gemm-library onednn,mkl: a row per library in one run, and under --profile every GEMM
// problem timed alone in both libraries, the faster one named, whichever library the row used.
TEST(BenchCli, TrainRunsARowPerGemmLibraryAndTimesEachProblemInBoth) {
  const CliResult r = run_cli(
      bench(
          {"train", "--preset",       "gpt2-tiny",  "--batch",         "2",        "--seq",
           "16",    "--steps",        "2",          "--warmup",        "1",        "--threads",
           "1",     "--precision",    "fp32",       "--ceiling-shape", "64,64,64", "--gemm-repeats",
           "1",     "--gemm-library", "onednn,mkl", "--profile"}),
      kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const std::vector<std::vector<std::string>> table = rows(r.out);
  ASSERT_EQ(table.size(), 2u) << r.out;
  EXPECT_EQ(table[0].back(), "onednn") << r.out;
  EXPECT_EQ(table[1].back(), "mkl") << r.out;
  // Both rows trained the same model from the same tokens: the same first loss to fp32 rounding.
  const std::string first_a = table[0][8].substr(0, table[0][8].find("->"));
  const std::string first_b = table[1][8].substr(0, table[1][8].find("->"));
  EXPECT_NEAR(std::stod(first_a), std::stod(first_b), 1e-3) << r.out;
  EXPECT_NE(r.out.find("# the step's GEMMs (oneMKL 20"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# profile of the fp32 1 thread(s) mkl row"), std::string::npos) << r.out;
  int problems = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("# gemm-problem ")) continue;
    ++problems;
    EXPECT_NE(line.find(" onednn_gflops="), std::string::npos) << line;
    EXPECT_NE(line.find(" mkl_gflops="), std::string::npos) << line;
    const bool named = line.find(" alone_library=onednn") != std::string::npos ||
                       line.find(" alone_library=mkl") != std::string::npos;
    EXPECT_TRUE(named) << line;
  }
  EXPECT_GE(problems, 2 * 9) << r.out;  // both rows: 9 roles or more each
}
#endif

TEST(BenchCli, TrainRefusesAnUnknownPrecision) {
  const CliResult r = run_cli(
      bench({"train", "--preset", "gpt2-tiny", "--steps", "1", "--precision", "fp8"}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("--precision: fp8 not in {fp32,bf16}"), std::string::npos) << r.err;
}

// Collectives: every size and algorithm verified (#wrong 0), bus bandwidth reported.
TEST(BenchCli, CommVerifiesEveryCollectiveAndAlgorithm) {
  const CliResult r = run_cli(bench({"comm", "--ranks", "2", "--min-bytes", "4096", "--max-bytes",
                                     "16384", "--seconds-per-size", "0.002"}),
                              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  int verified = 0;
  for (const auto& row : rows(r.out)) {
    if (row.size() == 8 && (row[0] == "4096" || row[0] == "16384")) {
      EXPECT_EQ(row[7], "0") << "wrong elements: " << row[0] << " " << row[3] << "\n" << r.out;
      ++verified;
    }
  }
  EXPECT_GE(verified, 3 * 2 * 3) << r.out;  // 3+ collectives x 2 sizes x 3 algorithms
  EXPECT_NE(r.out.find("# tuner (auto) vs best"), std::string::npos) << r.out;
}

// Data parallelism: every layout trains the same global batch, so dp 2 at ZeRO 0 and 1 end at
// the single rank's loss; the throughput ratio to dp 1 per row.
TEST(BenchCli, DataParallelComparesLayoutsOnTheSameGlobalBatch) {
  const auto data = make_corpus_dir("bench_dp", 8000, 2000);
  const auto config = write_tiny_config(data, 2, "");
  const CliResult r = run_cli(bench({"dp", config.string(), "--dp", "2", "--zero", "0,1", "--steps",
                                     "2", "--warmup", "0", "--repeat", "1"}),
                              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  // micro-batch 2 x dp 2: the widest layout's batch, for all of them.
  EXPECT_NE(r.out.find("global batch 4 x T=32"), std::string::npos) << r.out;
  const std::vector<std::vector<std::string>> table = rows(r.out);
  ASSERT_EQ(table.size(), 3u) << r.out;
  EXPECT_EQ(table[0][3], "1.00x") << r.out;
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(table[i].size(), 11u) << r.out;
    EXPECT_TRUE(table[i][3].ends_with("x")) << r.out;
    EXPECT_NEAR(std::stod(table[i][10]), std::stod(table[0][10]), 2e-4) << r.out;  // last loss
  }
}

TEST(BenchCli, DataParallelNeedsAnExistingConfig) {
  const std::string missing = (scratch_dir("bench_dp_missing") / "nope.toml").string();
  const CliResult r = run_cli(bench({"dp", missing}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("File does not exist: " + missing), std::string::npos) << r.err;
}

// Elastic: the snapshot's overhead against the uninterrupted run, and what a killed rank costs
// (rank 1 killed in step 3's backward; the snapshot of step 2 restored: one step lost).
TEST(BenchCli, ElasticPricesTheSnapshotAndAKilledRanksRecovery) {
  const auto data = make_corpus_dir("bench_elastic", 8000, 2000);
  const auto config = write_tiny_config(data, 2, "");
  const CliResult r =
      run_cli(bench({"elastic", config.string(), "--nproc", "2", "--steps", "6", "--fault-step",
                     "3", "--kinds", "kill", "--repeat", "1", "--warmup", "1"}),
              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("uninterrupted, no snapshots:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(": snapshot overhead "), std::string::npos) << r.out;
  std::vector<std::string> kill;
  for (const auto& row : rows(r.out)) {
    if (!row.empty() && row[0] == "kill") kill = row;
  }
  ASSERT_GE(kill.size(), 5u) << r.out;
  EXPECT_GT(std::stod(kill[1]), 0.0) << r.out;  // detection s
  EXPECT_GT(std::stod(kill[2]), 0.0) << r.out;  // recovery s
  EXPECT_EQ(kill[3], "1") << r.out;             // steps lost
  EXPECT_NE(r.out.find("killed by signal 9"), std::string::npos) << r.out;
}

TEST(BenchCli, ElasticNeedsTwoRanks) {
  const CliResult r = run_cli(
      bench({"elastic", LATTICE_SOURCE_DIR "/configs/gpt2-tiny.toml", "--nproc", "1"}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("--nproc: Value 1 not in range 2 to 64"), std::string::npos) << r.err;
}

// Calibration (--quick) writes a cluster profile that `lattice plan --cluster` reads, and the
// tuner's profile (every candidate algorithm per collective and group size) that a training run
// prices its collectives with through parallel.comm_profile.
TEST(BenchCli, CalibrateQuickWritesAProfileThatPlanReads) {
  const auto profile = scratch_dir("bench_calibrate") / "cpu.json";
  const CliResult r = run_cli(
      bench({"calibrate", "--quick", "--max-ranks", "2", "--out", profile.string()}), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("#   gemm fp32 m    64 k    64 n    64:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("#   all_reduce     2 ranks: alpha"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# wrote " + profile.string()), std::string::npos) << r.out;
  const CliResult plan =
      run_cli({LATTICE_EXECUTABLE, "plan", "--cluster", profile.string(), "--model", "gpt2-tiny",
               "--gpus", "2", "--global-batch", "8", "--seq", "64", "--json"},
              kLimitS);
  ASSERT_EQ(plan.exit_code, 0) << plan.all();
  EXPECT_NE(plan.out.find("\"this-machine\""), std::string::npos) << plan.out;

  const auto comm = profile.parent_path() / "cpu.comm.json";
  EXPECT_NE(r.out.find("# wrote " + comm.string() +
                       " (use: lattice train CONFIG --set parallel.comm_profile="),
            std::string::npos)
      << r.out;
  const CostProfile tuner = CostProfile::load(comm.string(), TransportKind::kThreads);
  for (const Collective c :
       {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter}) {
    for (const Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree}) {
      const std::optional<CostModel> model = tuner.find(c, a, 2);
      ASSERT_TRUE(model.has_value()) << collective_name(c) << " " << algorithm_name(a);
      EXPECT_GT(model->predict(1 << 20), 0.0);
    }
  }
  const auto data = make_corpus_dir("bench_calibrate_train");
  const CliResult train =
      run_cli({LATTICE_EXECUTABLE, "train", write_tiny_config(data, 2, "").string(), "--dp", "2",
               "--set", "batch.global_batch=8", "--set", "sample.tokens=0", "--set",
               "parallel.comm_profile=" + comm.string()},
              kLimitS);
  ASSERT_EQ(train.exit_code, 0) << train.all();
  EXPECT_NE(train.out.find("under the profile " + comm.string()), std::string::npos) << train.out;
}

}  // namespace
}  // namespace lattice::testing
