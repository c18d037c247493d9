#include "elastic/rank_status.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <thread>

#include "elastic/fault_injection.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

std::filesystem::path status_file(const std::string& name) {
  return testing::scratch_dir("status_" + name) / "status";
}

TEST(AtomicText, KeepsTextUpToItsCapacity) {
  AtomicText<8> text;
  text.store("tp[pp0");
  EXPECT_EQ(text.load(), "tp[pp0");
  const std::string long_name(70, 'g');
  text.store(long_name);
  EXPECT_EQ(text.load(), long_name.substr(0, 63));  // 8 words: 63 characters and the NUL
  text.store("dp");
  EXPECT_EQ(text.load(), "dp");
}

TEST(RankStatus, TheAgentSeesWhatTheRankReports) {
  const auto path = status_file("report");
  RankStatusMap agent_view = RankStatusMap::create(path);
  {
    RankStatusReporter reporter(RankStatusMap::open(path), /*generation=*/3, nullptr,
                                std::chrono::milliseconds(5));
    EXPECT_EQ(agent_view->generation.load(), 3);
    EXPECT_EQ(agent_view->pid.load(), ::getpid());
    reporter.on_step(7);
    reporter.on_phase(Phase::kBackward);
    EXPECT_EQ(agent_view->step.load(), 7);
    EXPECT_EQ(Phase(agent_view->phase.load()), Phase::kBackward);
    // On the training thread a collective is a phase of its own until it ends.
    reporter.on_collective("dp", 41);
    EXPECT_EQ(Phase(agent_view->phase.load()), Phase::kCollective);
    EXPECT_EQ(agent_view->collective_group.load(), "dp");
    EXPECT_EQ(agent_view->collective_seq.load(), 41u);
    reporter.on_collective_end();
    EXPECT_EQ(Phase(agent_view->phase.load()), Phase::kBackward);
    // Another thread's collective (the gradient comm thread) leaves the phase alone.
    std::thread([&] { reporter.on_collective("dp bucket", 42); }).join();
    EXPECT_EQ(Phase(agent_view->phase.load()), Phase::kBackward);
    EXPECT_EQ(agent_view->collective_seq.load(), 42u);
    // The heartbeat goes on by itself.
    const int64_t beat = agent_view->heartbeat_ns.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_GT(agent_view->heartbeat_ns.load(), beat);
    reporter.record_error("TimeoutError: rank 1 did not answer");
  }
  EXPECT_EQ(agent_view->error.load(), "TimeoutError: rank 1 did not answer");
  // After the rank is gone the record stays.
  const int64_t last = agent_view->heartbeat_ns.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(agent_view->heartbeat_ns.load(), last);
  std::filesystem::remove(path);
}

TEST(RankStatus, ReportedFaultsFireAtTheirPhase) {
  FaultInjector faults(parse_fault_specs("throw@collective:0:2"), 0);
  RankStatusReporter reporter(std::nullopt, 0, &faults, std::chrono::milliseconds(5));
  reporter.on_step(1);
  EXPECT_NO_THROW(reporter.on_collective("world", 1));
  reporter.on_step(2);
  EXPECT_NO_THROW(reporter.on_phase(Phase::kForward));
  EXPECT_THROW(reporter.on_collective("world", 2), FaultInjected);
}

TEST(RankStatus, OpeningSomethingElseIsAnIoErrorNamingIt) {
  const auto path = status_file("missing");
  EXPECT_THROW(RankStatusMap::open(path), IoError);
  { std::ofstream(path) << std::string(sizeof(RankStatus), 'x'); }
  try {
    RankStatusMap::open(path);
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos);
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace lattice
