// `lattice plan` through the executable: a layout that uses the devices asked for, and the
// refusals of an unknown model and a missing batch.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_run.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 60;

std::vector<std::string> plan(std::vector<std::string> extra) {
  std::vector<std::string> args = {LATTICE_EXECUTABLE, "plan"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(PlanCli, RecommendsAFeasibleLayoutOverEveryDevice) {
  const std::vector<std::string> setup = {"--model", "gpt2-124m", "--cluster",      "dgx-h100",
                                          "--gpus",  "8",         "--global-batch", "64",
                                          "--seq",   "1024"};
  std::vector<std::string> json_args = setup;
  json_args.insert(json_args.end(), {"--json", "--top", "3"});
  const CliResult r = run_cli(plan(json_args), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("model").at("name"), "gpt2-124m");
  EXPECT_EQ(j.at("cluster").at("devices"), 8);
  ASSERT_FALSE(j.at("ranked").empty()) << r.out;
  ASSERT_LE(j.at("ranked").size(), 3u);
  for (const nlohmann::json& e : j.at("ranked")) {
    const nlohmann::json& l = e.at("layout");
    EXPECT_EQ(l.at("dp").get<int>() * l.at("tp").get<int>() * l.at("pp").get<int>(), 8) << l;
    EXPECT_TRUE(e.at("feasible").get<bool>()) << e;
  }

  // The report names the same best layout.
  const CliResult text = run_cli(plan(setup), kLimitS);
  ASSERT_EQ(text.exit_code, 0) << text.all();
  const nlohmann::json& best = j.at("ranked")[0].at("layout");
  const std::string layout = "recommended: dp=" + std::to_string(best.at("dp").get<int>()) +
                             " tp=" + std::to_string(best.at("tp").get<int>()) +
                             " pp=" + std::to_string(best.at("pp").get<int>()) +
                             " zero=" + std::to_string(best.at("zero").get<int>()) +
                             " mb=" + std::to_string(best.at("micro_batch").get<int>());
  EXPECT_NE(text.out.find("model gpt2-124m"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("cluster dgx-h100 (8 devices"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(layout), std::string::npos) << layout << "\n" << text.out;
}

TEST(PlanCli, UnknownModelListsThePresets) {
  const CliResult r =
      run_cli(plan({"--model", "gpt-5", "--cluster", "dgx-h100", "--global-batch", "8"}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("unknown model preset 'gpt-5'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gpt2-124m"), std::string::npos) << r.err;
}

// A hand-edited cluster profile with a field of the wrong type: exit 3 naming the key and the
// types, never nlohmann's "[json.exception.type_error.302]".
TEST(PlanCli, AProfileFieldOfTheWrongTypeIsNamed) {
  const std::string path = ::testing::TempDir() + "plan_cli_profile.json";
  std::ofstream(path) << R"({"format": "lattice-cluster-profile", "version": 1,
                             "base": "dgx-h100", "gpus_per_node": "8"})";
  const CliResult r = run_cli(
      plan({"--model", "gpt2-124m", "--cluster", path, "--global-batch", "64", "--seq", "1024"}),
      kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("'gpus_per_node' is a string (\"8\"), expected an integer"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
  std::remove(path.c_str());
}

TEST(PlanCli, MissingGlobalBatchIsRefusedWithAnExample) {
  const CliResult r = run_cli(plan({"--model", "gpt2-124m", "--cluster", "dgx-h100"}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("--global-batch"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HINT"), std::string::npos) << r.err;
}

// --headroom 10%: the report says what a layout may use, the recommended one stays within it,
// and a share outside [0, 100) is refused naming the flag.
TEST(PlanCli, HeadroomKeepsTheRecommendationOffTheTopOfTheMemory) {
  const std::vector<std::string> setup = {
      "--model", "llama-3-70b", "--gpus", "64",    "--global-batch",
      "512",     "--seq",       "4096",   "--top", "1"};
  std::vector<std::string> with = setup;
  with.insert(with.end(), {"--headroom", "10%", "--json"});
  const CliResult r = run_cli(plan(with), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& memory = j.at("ranked")[0].at("memory");
  EXPECT_LE(memory.at("total_bytes").get<double>(), memory.at("capacity_bytes").get<double>());
  std::vector<std::string> text = setup;
  text.insert(text.end(), {"--headroom", "10"});
  const CliResult t = run_cli(plan(text), kLimitS);
  ASSERT_EQ(t.exit_code, 0) << t.all();
  EXPECT_NE(t.out.find("memory headroom 10%: a layout fits within"), std::string::npos) << t.out;
  std::vector<std::string> bad = setup;
  bad.insert(bad.end(), {"--headroom", "150%"});
  const CliResult b = run_cli(plan(bad), kLimitS);
  EXPECT_EQ(b.exit_code, 3) << b.all();
  EXPECT_NE(b.err.find("--headroom '150%' is not a percentage"), std::string::npos) << b.err;
}

// Prices and a token budget add energy, money and the run's length to the report; --deadline
// picks the fewest devices whose best layout trains the budget in time (fewer than given when
// the deadline is loose) and refuses, naming the fastest, when none does; --optimize cost
// without a price is refused.
TEST(PlanCli, PricesATokenBudgetAndADeadlineChooseAndCostTheRun) {
  const std::vector<std::string> setup = {"--model", "llama-3-8b", "--cluster",      "dgx-h100",
                                          "--nodes", "8",          "--global-batch", "256",
                                          "--seq",   "4096",       "--tokens",       "1e11"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = setup;
    a.insert(a.end(), extra.begin(), extra.end());
    return plan(a);
  };
  const CliResult priced = run_cli(with({"--price-gpu-hour", "2", "--json"}), kLimitS);
  ASSERT_EQ(priced.exit_code, 0) << priced.all();
  const nlohmann::json j = nlohmann::json::parse(priced.out);
  const double step = j.at("ranked").at(0).at("time").at("step_s").get<double>();
  // 64 devices at 2 per device-hour, no power price: money is device-hours.
  EXPECT_NEAR(j.at("cost").at("money_per_step").get<double>(), 64 * step / 3600.0 * 2, 1e-9);
  EXPECT_GT(j.at("cost").at("kwh_per_step").get<double>(), 0.0);
  const double hours = j.at("budget").at("hours").get<double>();
  EXPECT_NEAR(hours, 1e11 / (256.0 * 4096) * step / 3600.0, 1e-6 * hours);

  // A deadline twice the full cluster's time: fewer nodes do it, and the report says how many.
  const std::string loose = fmt::format("{}h", 2 * hours);
  const CliResult deadline =
      run_cli(with({"--deadline", loose, "--optimize", "energy", "--json"}), kLimitS);
  ASSERT_EQ(deadline.exit_code, 0) << deadline.all();
  const nlohmann::json d = nlohmann::json::parse(deadline.out);
  const int devices = d.at("cluster").at("devices").get<int>();
  EXPECT_LT(devices, 64) << deadline.out;
  EXPECT_EQ(d.at("devices_given"), 64);
  EXPECT_LE(d.at("budget").at("hours").get<double>(), 2 * hours);
  const CliResult text = run_cli(with({"--deadline", loose, "--optimize", "energy"}), kLimitS);
  EXPECT_NE(text.out.find(fmt::format("uses {} of the 64 devices given", devices)),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("energy per step:"), std::string::npos) << text.out;
  // "why not" weighs each alternative on the devices the recommendation uses, not the 64 given
  // (each had been refused as not dividing 64).
  const std::string why_not = text.out.substr(text.out.find("why not:"));
  EXPECT_EQ(why_not.find("rejected (device count)"), std::string::npos) << why_not;

  const CliResult impossible =
      run_cli(with({"--deadline", fmt::format("{}h", hours / 2)}), kLimitS);
  EXPECT_EQ(impossible.exit_code, 3) << impossible.all();
  EXPECT_NE(impossible.err.find("no layout trains 1e+11 tokens within"), std::string::npos)
      << impossible.err;
  EXPECT_NE(impossible.err.find("the fastest takes"), std::string::npos) << impossible.err;

  const CliResult unpriced = run_cli(with({"--optimize", "cost"}), kLimitS);
  EXPECT_EQ(unpriced.exit_code, 3) << unpriced.all();
  EXPECT_NE(unpriced.err.find("--optimize cost needs a price"), std::string::npos) << unpriced.err;
}

TEST(PlanCli, ValidatePublishedPrintsEveryCitedRunAndTheErrors) {
  const CliResult text = run_cli(plan({"--validate-published"}), kLimitS);
  ASSERT_EQ(text.exit_code, 0) << text.all();
  for (const char* expected :
       {"narayanan-1008b", "korthikanti-175b-selective-sp", "llama3-405b-16k-gpus",
        "21 of 21 published layouts accepted", "Korthikanti et al. 2022, Tables 3 and 5",
        "layers=0,1×126,0", "software profile 'megatron-lm 2021, NGC pytorch 20.12",
        "(measured on narayanan-1.7b)", "calib.", "over the 20 rows not used for calibration",
        "llama3-405b-128k-context", "dp=8 tp=8 pp=16 cp=16"}) {
    EXPECT_NE(text.out.find(expected), std::string::npos) << expected << "\n" << text.out;
  }
  const CliResult json = run_cli(plan({"--validate-published", "--json"}), kLimitS);
  ASSERT_EQ(json.exit_code, 0) << json.all();
  const nlohmann::json j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j.at("runs").size(), 21u);
  EXPECT_EQ(j.at("accepted").get<int>(), 21);
  EXPECT_EQ(j.at("judged").get<int>(), 20);
  double sum = 0;
  for (const nlohmann::json& row : j.at("runs")) {
    if (!row.at("calibration").get<bool>()) sum += std::abs(row.at("error").get<double>());
  }
  EXPECT_NEAR(j.at("mean_abs_error").get<double>(), sum / 20, 1e-12);
}

// Context parallelism: at Llama 3's 128K-token stage the search splits the sequence (the
// layout names cp and the report prices the ring); a cp that does not cut the sequence into
// 2·cp chunks is refused with the fix.
TEST(PlanCli, ALongSequenceIsSplitOverAContextParallelGroup) {
  const std::vector<std::string> long_context = {
      "--model",        "llama-3-405b", "--cluster",   "dgx-h100", "--gpus", "16384",
      "--global-batch", "128",          "--seq",       "131072",   "--tp",   "8",
      "--pp",           "16",           "--recompute", "none"};
  const CliResult r = run_cli(plan(long_context), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const std::string recommended = r.out.substr(r.out.find("recommended:"));
  EXPECT_NE(recommended.substr(0, recommended.find('\n')).find(" cp="), std::string::npos) << r.out;
  std::vector<std::string> fixed = long_context;
  fixed.insert(fixed.end(), {"--cp", "3"});
  const CliResult refused = run_cli(plan(fixed), kLimitS);
  EXPECT_NE(refused.exit_code, 0) << refused.all();
  EXPECT_NE(refused.all().find("does not divide the 16384 devices"), std::string::npos)
      << refused.all();
}

// Mixtral 8x7B on 8 DGX H100 nodes: the search spreads the experts (ep), the report says how
// many a rank holds, what the all-to-alls cost and why neither fewer nor more ranks per expert
// group; a fixed ep that does not divide the experts is refused.
TEST(PlanCli, ASparseModelSpreadsItsExpertsAndSaysWhy) {
  const std::vector<std::string> mixtral = {
      "--model", "mixtral-8x7b",   "--cluster", "dgx-h100", "--nodes",
      "8",       "--global-batch", "512",       "--seq",    "4096"};
  const CliResult r = run_cli(plan(mixtral), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("46.70 B parameters, 12.88 B active a token: 8 experts a layer, 2 a "
                       "token"),
            std::string::npos)
      << r.out;
  const std::string recommended = r.out.substr(r.out.find("recommended:"));
  const std::string line = recommended.substr(0, recommended.find('\n'));
  const size_t at = line.find(" ep=");
  ASSERT_NE(at, std::string::npos) << r.out;
  const int ep = std::stoi(line.substr(at + 4));
  EXPECT_NE(
      recommended.find(fmt::format("experts: {} of each layer's 8 on a rank (ep {}", 8 / ep, ep)),
      std::string::npos)
      << r.out;
  EXPECT_NE(recommended.find("expert all-to-alls"), std::string::npos) << r.out;
  EXPECT_NE(recommended.find("  ep 1 "), std::string::npos) << "why not ep 1: " << r.out;

  std::vector<std::string> json = mixtral;
  json.push_back("--json");
  const CliResult j = run_cli(plan(json), kLimitS);
  ASSERT_EQ(j.exit_code, 0) << j.all();
  EXPECT_EQ(nlohmann::json::parse(j.out).at("ranked")[0].at("layout").at("ep").get<int>(), ep);

  std::vector<std::string> odd = mixtral;
  odd.insert(odd.end(), {"--ep", "3"});
  const CliResult refused = run_cli(plan(odd), kLimitS);
  EXPECT_EQ(refused.exit_code, 3) << refused.all();
  EXPECT_NE(refused.err.find("ep = 3 does not divide model 'mixtral-8x7b''s 8 experts"),
            std::string::npos)
      << refused.err;
}

TEST(PlanCli, AGivenPipelineSplitIsPricedOrRefused) {
  const std::vector<std::string> llama = {
      "--model", "llama-3-405b", "--cluster",   "dgx-h100", "--gpus",         "8192",
      "--seq",   "8192",         "--tp",        "8",        "--pp",           "16",
      "--dp",    "64",           "--recompute", "none",     "--global-batch", "2048"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = llama;
    a.insert(a.end(), extra.begin(), extra.end());
    return plan(a);
  };
  const CliResult meta =
      run_cli(with({"--schedule", "1f1b", "--layers-per-chunk", "7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,7"}),
              kLimitS);
  ASSERT_EQ(meta.exit_code, 0) << meta.all();
  EXPECT_NE(meta.out.find("layers=7,8×14,7"), std::string::npos) << meta.out;
  const CliResult short_split = run_cli(with({"--layers-per-chunk", "7,8,8"}), kLimitS);
  EXPECT_EQ(short_split.exit_code, 3) << short_split.all();
  EXPECT_NE(short_split.err.find("sum to 23 but the model has 126 layers"), std::string::npos)
      << short_split.err;
}

}  // namespace
}  // namespace lattice::testing
