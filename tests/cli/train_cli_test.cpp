// `lattice train` through the executable: layouts larger than the machine (--oversubscribe),
// resume checks, the collective tuner under a slow link.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <regex>
#include <thread>

#include "cli/cli_run.h"
#include "train/test_corpus.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 120;

class TrainCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new std::filesystem::path(make_corpus_dir("train_cli_" + std::to_string(::getpid())));
    config_ = new std::filesystem::path(write_tiny_config(*data_, 4, ""));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*data_);
    delete data_;
    delete config_;
  }
  static std::vector<std::string> train(const std::filesystem::path& metrics,
                                        std::vector<std::string> extra) {
    std::vector<std::string> args = {
        LATTICE_EXECUTABLE, "train", config_->string(),      "--metrics", metrics.string(), "--set",
        "output.dir=",      "--set", "batch.global_batch=8", "--set",     "sample.tokens=0"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  static std::filesystem::path* data_;
  static std::filesystem::path* config_;
};
std::filesystem::path* TrainCli::data_ = nullptr;
std::filesystem::path* TrainCli::config_ = nullptr;

// Every step's loss in a metrics file (JSON lines).
std::vector<double> losses(const std::filesystem::path& metrics) {
  std::ifstream in(metrics);
  std::vector<double> out;
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, std::regex("\"loss\":([-0-9.e+]+)"))) {
      out.push_back(std::stod(m[1]));
    }
  }
  return out;
}

// Eight in-process ranks (dp 2 x tp 2 x pp 2), each asking for as many threads as the machine
// has cores: refused without the flag, run with it (one thread per rank) to the single rank's
// losses.
TEST_F(TrainCli, OversubscribeRunsALayoutLargerThanTheMachineToTheSingleRanksLosses) {
  const std::string cores = std::to_string(std::max(1u, std::thread::hardware_concurrency()));
  const std::vector<std::string> layout = {"--dp", "2", "--tp",  "2",
                                           "--pp", "2", "--set", "train.threads=" + cores};
  const auto dir = std::filesystem::path(*data_);
  const CliResult refused = run_cli(train(dir / "refused.jsonl", layout), kLimitS);
  EXPECT_EQ(refused.exit_code, 3) << refused.all();
  EXPECT_NE(refused.err.find("8 in-process ranks"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("--oversubscribe"), std::string::npos) << refused.err;

  std::vector<std::string> over = layout;
  over.push_back("--oversubscribe");
  const CliResult r = run_cli(train(dir / "over.jsonl", over), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.err.find("--oversubscribe: 8 in-process ranks"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("measure the scheduler"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("8 rank(s) x 1 thread(s)"), std::string::npos) << r.out;

  const CliResult one = run_cli(train(dir / "one.jsonl", {}), kLimitS);
  ASSERT_EQ(one.exit_code, 0) << one.all();
  const std::vector<double> a = losses(dir / "over.jsonl"), b = losses(dir / "one.jsonl");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * std::abs(b[i])) << i;
}

#if defined(LATTICE_HAVE_MKL)
// train.gemm_library = "mkl" through the command: the start line names oneMKL, and the run
// trains to oneDNN's losses within fp32 rounding.
TEST_F(TrainCli, TheGemmLibraryOfTheConfigRunsAndTrainsToTheSameLosses) {
  const auto dir = std::filesystem::path(*data_);
  const CliResult mkl =
      run_cli(train(dir / "mkl.jsonl", {"--set", "train.gemm_library=mkl"}), kLimitS);
  ASSERT_EQ(mkl.exit_code, 0) << mkl.all();
  EXPECT_NE(mkl.out.find("fp32, GEMMs in oneMKL 20"), std::string::npos) << mkl.out;
  const CliResult onednn = run_cli(train(dir / "onednn.jsonl", {}), kLimitS);
  ASSERT_EQ(onednn.exit_code, 0) << onednn.all();
  EXPECT_NE(onednn.out.find("fp32, GEMMs in oneDNN "), std::string::npos) << onednn.out;
  const std::vector<double> a = losses(dir / "mkl.jsonl"), b = losses(dir / "onednn.jsonl");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(b[i])) << i;
}
#endif

// A mixture-of-experts model through the command: the progress lines and the metrics carry the
// routers' loss and the experts' loads, tensor parallelism (every expert split over 2 ranks)
// trains to the single rank's losses, `doctor --run` judges the routing, and a layout the sparse
// layers cannot run is refused before any rank starts.
TEST_F(TrainCli, AMixtureOfExpertsTrainsWithTensorParallelismReportsItsRoutingAndRefusesCp) {
  const auto dir = std::filesystem::path(*data_);
  const auto out = dir / "moe_run";
  std::filesystem::remove_all(out);
  const std::vector<std::string> moe = {"--set", "model.preset=\"mixtral-tiny\"", "--set",
                                        "output.dir=" + out.string()};
  std::vector<std::string> split = moe;
  split.insert(split.end(), {"--tp", "2"});
  const CliResult r = run_cli(train(dir / "moe_tp.jsonl", split), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("mixtral-tiny"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| router "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| experts max/mean "), std::string::npos) << r.out;
  const std::vector<double> router = metric_values(dir / "moe_tp.jsonl", "router_loss");
  ASSERT_EQ(router.size(), 4u);
  for (double v : router) EXPECT_GT(v, 0.0);
  // Every rank's record holds each layer's tokens per expert: 8 rows of 32 tokens, 2 choices
  // each, all kept (dropless).
  const std::string record = read_text(out / "metrics" / "rank_00001.jsonl");
  EXPECT_NE(record.find("\"experts\":[{"), std::string::npos) << record.substr(0, 400);
  const nlohmann::json last = nlohmann::json::parse(record.substr(record.rfind("{\"at\"")));
  int64_t kept = 0;
  for (int64_t n : last.at("experts").at(0).at("tokens").get<std::vector<int64_t>>()) kept += n;
  EXPECT_EQ(kept, 8 * 32 * 2);

  const CliResult one = run_cli(train(dir / "moe_one.jsonl", moe), kLimitS);
  ASSERT_EQ(one.exit_code, 0) << one.all();
  const std::vector<double> a = losses(dir / "moe_tp.jsonl"), b = losses(dir / "moe_one.jsonl");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * std::abs(b[i])) << i;

  const CliResult doctor =
      run_cli({LATTICE_EXECUTABLE, "doctor", "--run", out.string(), "--json"}, kLimitS);
  EXPECT_NE(doctor.out.find("\"run-experts\""), std::string::npos) << doctor.all();
  EXPECT_EQ(doctor.out.find("no expert loads"), std::string::npos) << doctor.out;

  std::vector<std::string> cp = moe;
  cp.insert(cp.end(), {"--cp", "2"});
  const CliResult refused = run_cli(train(dir / "moe_cp.jsonl", cp), kLimitS);
  EXPECT_EQ(refused.exit_code, 3) << refused.all();
  EXPECT_NE(refused.err.find("route, cap and balance whole sequences"), std::string::npos)
      << refused.err;
}

// Expert parallelism through the command: dp 2 with each layer's experts over the 2 ranks trains
// to the single rank's losses, and its checkpoint (every expert written once, by the rank that
// holds it) resumes on one rank to the uninterrupted losses.
TEST_F(TrainCli, ExpertParallelTrainsToTheSingleRanksLossesAndItsCheckpointResumesOnOneRank) {
  const auto dir = std::filesystem::path(*data_);
  const std::vector<std::string> moe = {"--set", "model.preset=\"mixtral-tiny\""};
  const CliResult one = run_cli(train(dir / "ep_one.jsonl", moe), kLimitS);
  ASSERT_EQ(one.exit_code, 0) << one.all();
  const std::vector<double> b = losses(dir / "ep_one.jsonl");
  ASSERT_EQ(b.size(), 4u);
  // ZeRO-0, and ZeRO-1 sharded over the two ranks holding the same experts (each writes its
  // shard of the experts' moments, the dense ones once).
  for (const bool zero : {false, true}) {
    SCOPED_TRACE(zero ? "dp 4, ep 2, ZeRO-1" : "dp 2, ep 2");
    const auto out = dir / (zero ? "ep_zero_run" : "ep_run");
    std::filesystem::remove_all(out);
    std::vector<std::string> split = moe;
    split.insert(split.end(), {"--dp", zero ? "4" : "2", "--ep", "2", "--zero", zero ? "1" : "0",
                               "--oversubscribe", "--set", "output.dir=" + out.string(), "--set",
                               "output.checkpoint_every=2"});
    const auto metrics = dir / (zero ? "ep_zero.jsonl" : "ep.jsonl");
    const CliResult r = run_cli(train(metrics, split), kLimitS);
    ASSERT_EQ(r.exit_code, 0) << r.all();
    const std::vector<double> a = losses(metrics);
    ASSERT_EQ(a.size(), 4u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * std::abs(b[i])) << i;
    // The ep group carried the tokens: all-to-alls in the rank's metrics.
    EXPECT_NE(read_text(out / "metrics" / "rank_00000.jsonl").find("\"all_to_all\""),
              std::string::npos);

    std::vector<std::string> resume = moe;
    resume.insert(resume.end(), {"--resume", (out / "checkpoints" / "step_2").string()});
    const auto resumed_metrics = dir / (zero ? "ep_zero_resumed.jsonl" : "ep_resumed.jsonl");
    const CliResult resumed = run_cli(train(resumed_metrics, resume), kLimitS);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.all();
    const std::vector<double> tail = losses(resumed_metrics);
    ASSERT_EQ(tail.size(), 2u) << resumed.all();
    for (size_t i = 0; i < 2; ++i)
      EXPECT_NEAR(tail[i], b[i + 2], 1e-6 * b[i + 2]) << "step " << i + 3;
  }

  std::vector<std::string> zero = moe;
  zero.insert(zero.end(), {"--dp", "2", "--ep", "2", "--zero", "2"});
  const CliResult refused = run_cli(train(dir / "ep_zero2.jsonl", zero), kLimitS);
  EXPECT_EQ(refused.exit_code, 3) << refused.all();
  EXPECT_NE(refused.err.find("use --zero 0 or 1 with expert parallelism"), std::string::npos)
      << refused.err;
}

// --plan prices a mixture of experts as it runs: the forecast names the expert-parallel layout
// and its predicted peak is the measured one (the planner's runtime model counts the same
// buffers, tests/plan/validation_test.cpp).
TEST_F(TrainCli, APlanForecastsAnExpertParallelRun) {
  const auto dir = std::filesystem::path(*data_);
  const CliResult r =
      run_cli(train(dir / "ep_plan.jsonl",
                    {"--set", "model.preset=\"mixtral-tiny\"", "--dp", "2", "--ep", "2", "--plan",
                     "dgx-h100", "--set", "output.dir=" + (dir / "ep_plan_run").string()}),
              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const size_t at = r.out.find("plan (dgx-h100, dp=2 tp=1 pp=1 ep=2 zero=0");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  const size_t peak = line.find("a rank's peak ");
  ASSERT_NE(peak, std::string::npos) << line;
  const double predicted = std::stod(line.substr(peak + 14));
  // The measured table's total column (MiB) of rank 0.
  const size_t table = r.out.find("    0 (0, 0, 0) |");
  ASSERT_NE(table, std::string::npos) << r.out;
  const std::string row = r.out.substr(table, r.out.find('\n', table) - table);
  const double measured = std::stod(row.substr(row.rfind('|') + 1));
  EXPECT_NEAR(predicted, measured, 0.1) << line << "\n" << row;
}

// Context parallelism through the command: each sequence over two ranks (ring attention) trains
// to the single rank's losses; a sequence length that does not cut into 2·cp chunks is refused
// before any rank starts, naming the multiple that would.
TEST_F(TrainCli, ContextParallelTrainsToTheSingleRanksLossesAndRefusesASequenceThatDoesNotSplit) {
  const auto dir = std::filesystem::path(*data_);
  const CliResult r = run_cli(train(dir / "cp.jsonl", {"--cp", "2"}), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("mesh pp1·dp1·cp2·tp1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("context parallel: each sequence over 2 ranks (ring attention, 16 "
                       "positions a rank)"),
            std::string::npos)
      << r.out;
  const CliResult one = run_cli(train(dir / "cp_one.jsonl", {}), kLimitS);
  ASSERT_EQ(one.exit_code, 0) << one.all();
  const std::vector<double> a = losses(dir / "cp.jsonl"), b = losses(dir / "cp_one.jsonl");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * std::abs(b[i])) << i;

  const CliResult refused = run_cli(train(dir / "cp3.jsonl", {"--cp", "3"}), kLimitS);
  EXPECT_EQ(refused.exit_code, 3) << refused.all();
  EXPECT_NE(refused.err.find("multiple of 6"), std::string::npos) << refused.err;
}

// A context-parallel run's checkpoint (ZeRO-1 shards over its dp × cp replicas) resumes to the
// uninterrupted run's losses, on the same layout and on one rank without cp (resharded).
TEST_F(TrainCli, AContextParallelCheckpointResumesToTheUninterruptedLosses) {
  const auto out = *data_ / "cp_resume_run";
  std::filesystem::remove_all(out);
  const CliResult first =
      run_cli(train(*data_ / "cp_first.jsonl",
                    {"--cp", "2", "--zero", "1", "--set", "output.dir=" + out.string(), "--set",
                     "output.checkpoint_every=2"}),
              kLimitS);
  ASSERT_EQ(first.exit_code, 0) << first.all();
  const std::vector<double> whole = losses(*data_ / "cp_first.jsonl");
  ASSERT_EQ(whole.size(), 4u);
  const std::string checkpoint = (out / "checkpoints" / "step_2").string();
  ASSERT_TRUE(std::filesystem::exists(checkpoint)) << first.all();
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--cp", "2", "--zero", "1"}, std::vector<std::string>{}}) {
    std::vector<std::string> args = layout;
    args.insert(args.end(), {"--resume", checkpoint});
    const CliResult resumed = run_cli(train(*data_ / "cp_resumed.jsonl", args), kLimitS);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.all();
    const std::vector<double> tail = losses(*data_ / "cp_resumed.jsonl");
    ASSERT_EQ(tail.size(), 2u) << resumed.all();
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_NEAR(tail[i], whole[i + 2], 1e-6 * whole[i + 2])
          << "step " << i + 3 << " cp " << (layout.empty() ? 1 : 2);
    }
  }
}

// A resume that would not continue the saved run is refused through the command, naming the
// key, both values and the two ways out; --resume-allow-change accepts it.
TEST_F(TrainCli, ResumeRefusesAChangedGlobalBatchUnlessAllowed) {
  const auto out = *data_ / "resume_run";
  std::filesystem::remove_all(out);
  const std::vector<std::string> save = {"--set", "output.dir=" + out.string(), "--set",
                                         "output.checkpoint_every=2"};
  const CliResult first = run_cli(train(*data_ / "first.jsonl", save), kLimitS);
  ASSERT_EQ(first.exit_code, 0) << first.all();
  const std::string checkpoint = (out / "checkpoints" / "step_2").string();
  ASSERT_TRUE(std::filesystem::exists(checkpoint)) << first.all();

  const std::vector<std::string> changed = {"--resume", checkpoint, "--set",
                                            "batch.global_batch=16"};
  const CliResult refused = run_cli(train(*data_ / "refused.jsonl", changed), kLimitS);
  EXPECT_EQ(refused.exit_code, 3) << refused.all();
  EXPECT_NE(refused.err.find("batch.global_batch: saved 8, now 16"), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("--set batch.global_batch=8"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("--resume-allow-change batch.global_batch"), std::string::npos)
      << refused.err;

  std::vector<std::string> allowed = changed;
  allowed.insert(allowed.end(), {"--resume-allow-change", "batch.global_batch"});
  const CliResult r = run_cli(train(*data_ / "allowed.jsonl", allowed), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("at step 2"), std::string::npos) << r.out;
  EXPECT_EQ(losses(*data_ / "allowed.jsonl").size(), 2u);  // steps 3 and 4
}

// Every change of the math is refused through the command (issue: "resume still accepts
// changes of the math"): a sparse model's routing, capacity, auxiliary loss and norm epsilon,
// and training data of the same size with one token changed; each names the key and both values
// and is accepted with --resume-allow-change KEY. The same tokens under another directory, and
// the output, log and sampling keys, resume freely.
TEST_F(TrainCli, ResumeRefusesEveryChangeOfTheMathNamingTheKeyAndBothValues) {
  const auto out = *data_ / "resume_math_run";
  std::filesystem::remove_all(out);
  const std::vector<std::string> moe = {"--set", "model.preset=\"mixtral-tiny\""};
  std::vector<std::string> save = moe;
  save.insert(save.end(),
              {"--set", "output.dir=" + out.string(), "--set", "output.checkpoint_every=2"});
  const CliResult first = run_cli(train(*data_ / "math_first.jsonl", save), kLimitS);
  ASSERT_EQ(first.exit_code, 0) << first.all();
  const std::string checkpoint = (out / "checkpoints" / "step_2").string();
  const auto resume = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = moe;
    args.insert(args.end(), {"--resume", checkpoint});
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(train(*data_ / "math_resumed.jsonl", args), kLimitS);
  };
  struct Change {
    std::string key, value, expected;
  };
  for (const Change& change : std::vector<Change>{
           {"model.experts_per_token", "1", "model.experts_per_token: saved 2, now 1"},
           {"model.capacity_factor", "1.25", "model.capacity_factor: saved 0, now 1.25"},
           {"model.moe_aux_loss", "0.02", "model.moe_aux_loss: saved 0.01, now 0.02"},
           {"model.norm_eps", "1e-6", "model.norm_eps: saved 1e-05, now 1e-06"}}) {
    const CliResult refused = resume({"--set", change.key + "=" + change.value});
    EXPECT_EQ(refused.exit_code, 3) << refused.all();
    EXPECT_NE(refused.err.find(change.expected), std::string::npos) << refused.err;
    EXPECT_NE(refused.err.find("--resume-allow-change " + change.key), std::string::npos)
        << refused.err;
    EXPECT_EQ(refused.out.find("resumed from"), std::string::npos) << refused.out;
  }
  const CliResult allowed = resume(
      {"--set", "model.experts_per_token=1", "--resume-allow-change", "model.experts_per_token"});
  ASSERT_EQ(allowed.exit_code, 0) << allowed.all();
  EXPECT_NE(allowed.out.find("at step 2"), std::string::npos) << allowed.out;

  // The data: the same tokens elsewhere resume; one token changed (same size) does not.
  const auto copy = *data_ / "resume_math_data";
  std::filesystem::create_directories(copy);
  std::filesystem::copy_file(*data_ / "val.bin", copy / "val.bin",
                             std::filesystem::copy_options::overwrite_existing);
  const TokenFile original(*data_ / "train.bin");
  std::vector<int32_t> tokens(original.tokens().begin(), original.tokens().end());
  write_token_file(copy / "train.bin", tokens);
  const CliResult moved =
      resume({"--set", "data.dir=" + copy.string(), "--set", "output.keep_last=5", "--set",
              "train.log_interval=2", "--set", "sample.tokens=3"});
  EXPECT_EQ(moved.exit_code, 0) << moved.all();
  tokens[tokens.size() / 2] = tokens[tokens.size() / 2] == 'a' ? 'b' : 'a';
  write_token_file(copy / "train.bin", tokens);
  const CliResult changed = resume({"--set", "data.dir=" + copy.string()});
  EXPECT_EQ(changed.exit_code, 3) << changed.all();
  EXPECT_NE(
      changed.err.find(fmt::format("data.dir: saved a train.bin of {} tokens with CRC32C {:08x}",
                                   tokens.size(), original.content_checksum())),
      std::string::npos)
      << changed.err;
  EXPECT_NE(changed.err.find("--resume-allow-change data.dir"), std::string::npos) << changed.err;
}

// The tuner on the user path: with the link 0 -> 1 of four in-process ranks 20 ms slow, the
// training logs the switch of its gradient all-reduce at a step boundary and ends with the
// losses of the --deterministic run (ring, no switch) within 1e-6.
TEST_F(TrainCli, ASlowLinkSwitchesTheCollectiveAtAStepBoundaryAndKeepsTheDeterministicLosses) {
  const std::vector<std::string> layout = {"--dp", "4", "--oversubscribe", "--set",
                                           "train.steps=12"};
  const auto dir = std::filesystem::path(*data_);
  const CliResult tuned =
      run_cli(train(dir / "tuned.jsonl", layout), kLimitS, {"LATTICE_SLOW_LINK=0:1:20"});
  ASSERT_EQ(tuned.exit_code, 0) << tuned.all();
  EXPECT_NE(tuned.out.find("collectives: the cheapest algorithm per message size"),
            std::string::npos)
      << tuned.out;
  std::smatch switched;
  ASSERT_TRUE(std::regex_search(
      tuned.err, switched,
      std::regex("comm tuner after step ([0-9]+): all_reduce of [0-9]+ bytes on group "
                 "'dp[^']*' ran [0-9.]+x slower than predicted; re-measured: "
                 "ring=[0-9.]+ms hd=[0-9.]+ms tree=[0-9.]+ms; measured again: (hd|ring)=[0-9.]+ms "
                 "tree=[0-9.]+ms \\(the gain held\\); (hd|ring) -> tree")))
      << tuned.err;
  EXPECT_GE(std::stoi(switched[1]), 8);  // after the first window of 8 steps

  std::vector<std::string> pinned_layout = layout;
  pinned_layout.push_back("--deterministic");
  const CliResult pinned =
      run_cli(train(dir / "pinned.jsonl", pinned_layout), kLimitS, {"LATTICE_SLOW_LINK=0:1:2"});
  ASSERT_EQ(pinned.exit_code, 0) << pinned.all();
  EXPECT_NE(pinned.out.find("collectives: ring everywhere"), std::string::npos) << pinned.out;
  EXPECT_EQ(pinned.err.find("comm tuner"), std::string::npos) << pinned.err;

  const std::vector<double> a = losses(dir / "tuned.jsonl"), b = losses(dir / "pinned.jsonl");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * std::abs(b[i])) << i;

  const CliResult bad =
      run_cli(train(dir / "bad.jsonl", layout), kLimitS, {"LATTICE_SLOW_LINK=0:9:20"});
  EXPECT_EQ(bad.exit_code, 3) << bad.all();
  EXPECT_NE(bad.err.find("LATTICE_SLOW_LINK item '0:9:20'"), std::string::npos) << bad.err;
}

// The flags that name a choice are parsed once, before any rank starts: a misspelt one is refused
// with the choices (and the run's own config keys the same way).
TEST_F(TrainCli, AMisspeltChoiceIsRefusedWithTheChoicesBeforeAnyRankStarts) {
  const auto dir = scratch_dir("train_cli_choices");
  struct Case {
    std::vector<std::string> flags;
    std::string named;
  };
  const Case cases[] = {
      {{"--pp", "2", "--schedule", "1f2b"}, "1f1b"},
      {{"--recompute", "sometimes"}, "selective"},
      {{"--transport", "tcp"}, "gloo"},
      {{"--set", "data.mode=random"}, "shuffled"},
      {{"--set", "data.tokenizer=bpe9"}, "byte"},
      {{"--set", "train.gemm_library=cublas"}, "onednn, mkl"},
  };
  for (const Case& c : cases) {
    const CliResult r = run_cli(train(dir / "choices.jsonl", c.flags), kLimitS);
    EXPECT_EQ(r.exit_code, 3) << c.flags.back();
    EXPECT_NE(r.err.find(c.named), std::string::npos) << c.flags.back() << "\n" << r.all();
    EXPECT_EQ(r.out.find("step "), std::string::npos) << c.flags.back() << ": a rank trained";
  }
}

// A misspelt choice is one mistake with one exit code: the flag and the config key are refused
// alike (ConfigError, exit 3), each naming where the value came from and the choices.
TEST_F(TrainCli, AMisspeltChoiceIsRefusedAlikeAsAFlagAndAsAConfigKey) {
  struct Choice {
    std::string flag, key, hint;
  };
  const std::vector<Choice> choices = {
      {"--transport", "parallel.transport", "use threads, mpi or gloo"},
      {"--schedule", "parallel.schedule", "gpipe, 1f1b"},
      {"--recompute", "parallel.recompute", "none, selective or full"}};
  const auto metrics = std::filesystem::path(*data_) / "choice.jsonl";
  for (const Choice& c : choices) {
    const CliResult flag = run_cli(train(metrics, {c.flag, "foo"}), kLimitS);
    EXPECT_EQ(flag.exit_code, 3) << flag.all();
    EXPECT_NE(flag.err.find(c.flag + " foo: "), std::string::npos) << flag.err;
    EXPECT_NE(flag.err.find(c.hint), std::string::npos) << flag.err;
    const CliResult key = run_cli(train(metrics, {"--set", c.key + "=foo"}), kLimitS);
    EXPECT_EQ(key.exit_code, 3) << key.all();
    EXPECT_NE(key.err.find("'" + c.key + "' = \"foo\""), std::string::npos) << key.err;
    EXPECT_NE(key.err.find(c.hint), std::string::npos) << key.err;
  }
}

}  // namespace
}  // namespace lattice::testing
