#include "elastic/fault_injection.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include "support/scratch_dir.h"

namespace lattice {
namespace {

std::filesystem::path fresh_dir(const std::string& name) {
  return testing::scratch_dir("fault_" + name);
}

TEST(FaultSpecs, ParseEveryKindPhaseAndTheOptionalCount) {
  const std::vector<FaultSpec> specs = parse_fault_specs(
      "kill@backward:2:300,stop@forward:1:5,hang@optimizer:0:7:2,"
      "throw@collective:3:*,slow@snapshot:1:0");
  ASSERT_EQ(specs.size(), 5u);
  EXPECT_EQ(specs[0].kind, FaultKind::kKill);
  EXPECT_EQ(specs[0].phase, Phase::kBackward);
  EXPECT_EQ(specs[0].rank, 2);
  EXPECT_EQ(specs[0].step, 300);
  EXPECT_EQ(specs[0].times, 1);
  EXPECT_EQ(specs[2].times, 2);
  EXPECT_EQ(specs[3].step, kAnyStep);
  EXPECT_EQ(specs[4].kind, FaultKind::kSlow);
  for (const FaultSpec& s : specs)
    EXPECT_EQ(parse_fault_specs(s.to_string())[0].to_string(), s.to_string());
  EXPECT_EQ(specs[0].to_string(), "kill@backward:2:300");
  EXPECT_EQ(specs[2].to_string(), "hang@optimizer:0:7:2");
}

TEST(FaultSpecs, AMalformedItemIsAConfigErrorNamingIt) {
  for (const char* bad : {"kill", "explode@forward:0:1", "kill@lunch:0:1", "kill@forward:x:1",
                          "kill@forward:0", "kill@forward:0:1:0", "kill@starting:0:1"}) {
    try {
      parse_fault_specs(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos) << e.what();
    }
  }
}

TEST(FaultInjector, FiresOnlyOnItsRankPhaseAndStep) {
  FaultInjector faults(parse_fault_specs("throw@optimizer:1:3"), /*rank=*/1);
  EXPECT_NO_THROW(faults.at(Phase::kOptimizer, 2));
  EXPECT_NO_THROW(faults.at(Phase::kForward, 3));
  EXPECT_THROW(faults.at(Phase::kOptimizer, 3), FaultInjected);
  EXPECT_NO_THROW(faults.at(Phase::kOptimizer, 3));  // once
  FaultInjector other(parse_fault_specs("throw@optimizer:1:3"), /*rank=*/0);
  EXPECT_NO_THROW(other.at(Phase::kOptimizer, 3));
}

TEST(FaultInjector, FiringsAreCountedAcrossProcessesInTheJobDirectory) {
  const auto dir = fresh_dir("count");
  // Two injectors on one directory stand for a rank and its restarted self.
  FaultInjector first(parse_fault_specs("throw@forward:0:4:2"), 0, dir);
  FaultInjector restarted(parse_fault_specs("throw@forward:0:4:2"), 0, dir);
  EXPECT_THROW(first.at(Phase::kForward, 4), FaultInjected);
  EXPECT_THROW(restarted.at(Phase::kForward, 4), FaultInjected);
  EXPECT_NO_THROW(restarted.at(Phase::kForward, 4));  // times = 2, both used
  FaultInjector third(parse_fault_specs("throw@forward:0:4:2"), 0, dir);
  EXPECT_NO_THROW(third.at(Phase::kForward, 4));
  std::filesystem::remove_all(dir);
}

TEST(FaultInjector, AnyStepFiresTheFirstTimeThePhaseIsReached) {
  FaultInjector faults(parse_fault_specs("throw@recovery:2:*"), 2);
  EXPECT_NO_THROW(faults.at(Phase::kForward, 0));
  EXPECT_THROW(faults.at(Phase::kRecovery, 17), FaultInjected);
  EXPECT_NO_THROW(faults.at(Phase::kRecovery, 18));
}

}  // namespace
}  // namespace lattice
