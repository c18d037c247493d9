// A rank process's view of its agent: the assignments it reads from its status record and the
// fencing of a generation the agent has replaced (docs/elastic.md).
#include "elastic/rank_session.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "support/scratch_dir.h"

namespace lattice {
namespace {

using namespace std::chrono_literals;

// The variables `lattice launch` gives a rank process, for the life of one test.
class FakeAgent {
 public:
  explicit FakeAgent(const std::string& name) : dir_(testing::scratch_dir("session_" + name)) {
    record_.emplace(RankStatusMap::create(process_status_path(dir_, 0)));
    ::setenv("LATTICE_AGENT_DIR", dir_.c_str(), 1);
    ::setenv("LATTICE_STATUS_FILE", process_status_path(dir_, 0).c_str(), 1);
    ::unsetenv("LATTICE_AGENT_PID");
    ::unsetenv("LATTICE_FAULT");
  }
  ~FakeAgent() {
    ::unsetenv("LATTICE_AGENT_DIR");
    ::unsetenv("LATTICE_STATUS_FILE");
    record_.reset();
    std::filesystem::remove_all(dir_);
  }
  // What Agent::assign writes: the generation last.
  void assign(int64_t generation, int rank, int world) {
    RankStatus& s = **record_;
    s.assigned_rank.store(rank);
    s.assigned_world.store(world);
    s.assigned_generation.store(generation, std::memory_order_release);
  }
  RankStatus& record() { return **record_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::optional<RankStatusMap> record_;
};

TEST(RankSession, ASpareWaitsForItsAssignmentAndJoinsAsTheRankGiven) {
  FakeAgent agent("spare");
  RankSession session(0, ElasticConfig{});
  ASSERT_TRUE(session.agent().has_value());
  EXPECT_EQ(session.snapshots(), snapshot_root(agent.dir()));
  EXPECT_EQ(session.assignment().generation, -1);  // a spare: nothing yet
  EXPECT_FALSE(session.await_assignment(-1, 30ms).has_value());
  std::jthread later([&] {
    std::this_thread::sleep_for(50ms);
    agent.assign(2, 1, 3);
  });
  const std::optional<Assignment> a = session.await_assignment(-1, 10s);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->generation, 2);
  EXPECT_EQ(a->rank, 1);
  EXPECT_EQ(a->world, 3);
  session.begin(*a);
  EXPECT_EQ(session.generation(), 2);
  EXPECT_EQ(agent.record().generation.load(), 2);  // the agent sees which generation it joined
  EXPECT_EQ(Phase(agent.record().phase.load()), Phase::kStarting);
  EXPECT_NO_THROW(session.check_current());
}

TEST(RankSession, AReplacedGenerationIsFenced) {
  FakeAgent agent("fenced");
  agent.assign(0, 0, 2);
  RankSession session(0, ElasticConfig{});
  session.begin(session.assignment());
  EXPECT_NO_THROW(session.check_current());
  // A rank waiting for the generation after 0 sees none until the agent starts it.
  EXPECT_FALSE(session.await_assignment(0, 20ms).has_value());
  agent.assign(1, 0, 2);
  try {
    session.check_current();
    ADD_FAILURE() << "a rank of generation 0 passed the fence of generation 1";
  } catch (const Superseded& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to generation 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("generation 1"), std::string::npos) << e.what();
  }
  const std::optional<Assignment> next = session.await_assignment(0, 1s);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->generation, 1);
  session.begin(*next);
  EXPECT_NO_THROW(session.check_current());
}

TEST(RankSession, AnAgentDirectoryWithoutAStatusFileIsAConfigError) {
  ::setenv("LATTICE_AGENT_DIR", "/tmp", 1);
  ::unsetenv("LATTICE_STATUS_FILE");
  EXPECT_THROW(detect_agent_link(), ConfigError);
  ::unsetenv("LATTICE_AGENT_DIR");
  EXPECT_FALSE(detect_agent_link().has_value());
}

}  // namespace
}  // namespace lattice
