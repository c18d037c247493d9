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

// The agent's stuck verdict scales with the longest gap between two progress reports of the
// work the rank did; a collective's wait for a peer is no work and does not count.
TEST(RankStatus, TheLongestGapBetweenProgressReportsIsPublishedWhenAStepEnds) {
  const auto path = status_file("gap");
  RankStatusMap agent_view = RankStatusMap::create(path);
  RankStatusReporter reporter(RankStatusMap::open(path), 0, nullptr, std::chrono::milliseconds(5));
  auto sleep_ms = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  reporter.on_step(0);
  // A recovery reports the step it restored, then trains it: no step was trained in between.
  reporter.on_phase(Phase::kRecovery);
  sleep_ms(30);
  reporter.on_step(0);
  EXPECT_EQ(agent_view->longest_progress_gap_ns.load(), 0) << "a restore is no step";
  reporter.on_phase(Phase::kForward);
  sleep_ms(20);
  reporter.on_progress();  // a layer done after 20 ms
  sleep_ms(60);
  reporter.on_progress();  // the head after 60 ms: the longest of the step's work
  reporter.on_collective("dp", 1);
  sleep_ms(150);  // waiting for a peer
  reporter.on_collective_end();
  reporter.on_phase(Phase::kOptimizer);
  EXPECT_EQ(agent_view->longest_progress_gap_ns.load(), 0) << "nothing before the step ends";
  reporter.on_step(1);
  const double gap_ms = double(agent_view->longest_progress_gap_ns.load()) / 1e6;
  EXPECT_GE(gap_ms, 60.0);
  EXPECT_LT(gap_ms, 150.0) << "the collective's wait counted as work";
  // A shorter step leaves the longest gap as it was; a longer one raises it.
  reporter.on_phase(Phase::kForward);
  sleep_ms(5);
  reporter.on_step(2);
  EXPECT_EQ(double(agent_view->longest_progress_gap_ns.load()) / 1e6, gap_ms);
  reporter.on_phase(Phase::kBackward);
  sleep_ms(200);
  reporter.on_step(3);
  EXPECT_GE(double(agent_view->longest_progress_gap_ns.load()) / 1e6, 200.0);
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
