// `lattice launch --nnodes 2` through the executable, both "nodes" on this machine: two agents,
// agent 0 serving the job's store, each with its own shared memory. The job across two agents
// trains bitwise as one agent with all the ranks; a rank killed on the other node comes back
// from the in-memory snapshot; a node lost with its shared memory is restored from the replica
// on the surviving node; a process without the job's secret is refused and logged
// (docs/elastic.md, "Several nodes").
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <regex>
#include <thread>

#include "cli/cli_run.h"
#include "train/test_corpus.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 120;

// A port nothing listens on now (the kernel's pick).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t length = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The job directory in shared memory of an agent that was killed (it removes its own otherwise).
void remove_job_dir(pid_t agent) {
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (entry.path().filename().string().starts_with(fmt::format("lattice-{}-", agent))) {
      std::filesystem::remove_all(entry.path());
    }
  }
}

// A node lost whole: its agent killed (its ranks die with it, PR_SET_PDEATHSIG) and its shared
// memory gone with it.
void kill_node(CliProcess& agent) {
  agent.signal(SIGKILL);
  agent.wait(kLimitS);
  remove_job_dir(agent.pid());
}

class ElasticNodes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ =
        new std::filesystem::path(make_corpus_dir("elastic_nodes_" + std::to_string(::getpid())));
    config_ = new std::filesystem::path(
        write_tiny_config(*data_, 40, "[eval]\ninterval = 0\nbatches = 2\n"));
  }
  static void TearDownTestSuite() {
    const std::string suffix = fmt::format("_{}", ::getpid());
    for (const auto& entry :
         std::filesystem::directory_iterator(std::filesystem::temp_directory_path())) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with("lattice_elastic_nodes_") && name.ends_with(suffix)) {
        std::filesystem::remove_all(entry.path());
      }
    }
    std::filesystem::remove_all(*data_);
    delete data_;
    delete config_;
  }

  static std::filesystem::path out_dir(const std::string& name) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("lattice_elastic_nodes_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
  }

  // The train command after `--`: the global batch 12 on `world` ranks (micro-batch 12/world).
  static std::vector<std::string> train(int world, const std::filesystem::path& out,
                                        std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"train",
                                     config_->string(),
                                     "--dp",
                                     std::to_string(world),
                                     "--deterministic",
                                     "--set",
                                     fmt::format("batch.micro_batch={}", 12 / world),
                                     "--set",
                                     "output.dir=" + out.string(),
                                     "--metrics",
                                     (out / "metrics.jsonl").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // One agent of an `nnodes`-node job with `nproc` ranks each.
  static std::vector<std::string> agent(int node, int nproc, int port,
                                        const std::filesystem::path& dir,
                                        std::vector<std::string> launch_flags,
                                        std::vector<std::string> extra_train = {}, int nnodes = 2) {
    std::vector<std::string> args = {LATTICE_EXECUTABLE, "launch",
                                     "--nproc-per-node", std::to_string(nproc),
                                     "--nnodes",         std::to_string(nnodes),
                                     "--node-rank",      std::to_string(node),
                                     "--rdzv",           fmt::format("127.0.0.1:{}", port),
                                     "--secret-file",    (dir / "secret").string()};
    args.insert(args.end(), launch_flags.begin(), launch_flags.end());
    args.push_back("--");
    for (std::string& a : train(nnodes * nproc, dir / "out", std::move(extra_train))) {
      args.push_back(std::move(a));
    }
    return args;
  }

  // The same job under one agent: the baseline.
  static std::filesystem::path one_agent(int world, const std::string& name,
                                         std::vector<std::string> extra = {}) {
    const auto dir = out_dir(name);
    std::vector<std::string> args = {LATTICE_EXECUTABLE, "launch", "--nproc-per-node",
                                     std::to_string(world), "--"};
    for (std::string& a : train(world, dir / "out", std::move(extra))) args.push_back(a);
    const CliResult r = run_cli(args, kLimitS);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    return dir / "out";
  }

  static void expect_same_final(const std::filesystem::path& a, const std::filesystem::path& b,
                                int ranks) {
    for (int r = 0; r < ranks; ++r) {
      const std::string file = fmt::format("final/rank_{:05d}.safetensors", r);
      ASSERT_TRUE(std::filesystem::exists(a / file)) << a / file;
      EXPECT_TRUE(same_bytes(a / file, b / file)) << file << " differs";
    }
  }

  // The step restored ("restored from the in-memory snapshot of step N"), -1 when none was.
  static int restored_step(const std::string& out) {
    std::smatch m;
    if (!std::regex_search(out, m,
                           std::regex("restored from the in-memory snapshot of step (\\d+)"))) {
      return -1;
    }
    return std::stoi(m[1]);
  }

  // The last loss of `metrics` within 1e-5 of the uninterrupted run `full`'s.
  static void expect_loss_near(const std::filesystem::path& metrics,
                               const std::filesystem::path& full) {
    const double reference = last_metric(full / "metrics.jsonl", "loss");
    EXPECT_NEAR(last_metric(metrics, "loss"), reference, 1e-5 * std::abs(reference));
  }

  static std::filesystem::path* data_;
  static std::filesystem::path* config_;
};
std::filesystem::path* ElasticNodes::data_ = nullptr;
std::filesystem::path* ElasticNodes::config_ = nullptr;

TEST_F(ElasticNodes, TwoAgentsTrainBitwiseAsOneAgentWithAllTheRanks) {
  const auto base = one_agent(2, "one_agent2");
  const auto dir = out_dir("two_agents");
  const int port = free_port();
  CliProcess other(agent(1, 1, port, dir, {}));
  const CliResult r = run_cli(agent(0, 1, port, dir, {}), kLimitS);
  const CliResult o = other.wait(kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  ASSERT_EQ(o.exit_code, 0) << o.all();
  EXPECT_NE(r.err.find(fmt::format("2 agents met at 127.0.0.1:{}", port)), std::string::npos)
      << r.err;
  expect_same_final(dir / "out", base, 2);
  // The secret agent 0 made is the user's alone.
  EXPECT_EQ(std::filesystem::status(dir / "secret").permissions() &
                (std::filesystem::perms::group_all | std::filesystem::perms::others_all),
            std::filesystem::perms::none);
}

TEST_F(ElasticNodes, ARankKilledOnTheOtherNodeComesBackFromTheSnapshotBitwise) {
  const auto base = one_agent(2, "one_agent2_kill");
  const auto dir = out_dir("kill_other_node");
  const int port = free_port();
  CliProcess other(agent(1, 1, port, dir, {}), {"LATTICE_FAULT=kill@backward:1:5"});
  const CliResult r = run_cli(agent(0, 1, port, dir, {}), kLimitS);
  const CliResult o = other.wait(kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  ASSERT_EQ(o.exit_code, 0) << o.all();
  EXPECT_NE(r.err.find("rank 1 failed in generation 0 at step 5: killed by signal 9"),
            std::string::npos)
      << r.err;
  // Rank 0 kept in its process on node 0, rank 1 a new process on node 1.
  EXPECT_TRUE(std::regex_search(
      r.err,
      std::regex(
          R"(generation 1: ranks 0 \(node 0, process 0, kept\), 1 \(node 1, process \d+, new\))")))
      << r.err;
  EXPECT_GE(restored_step(r.out), 4) << r.out;  // at most one step lost
  expect_same_final(dir / "out", base, 2);
}

// Two ranks per node; node 1 is lost after step 8: its agent killed with its ranks and its shared
// memory deleted, or the whole node frozen (SIGSTOP to its agent and ranks: no socket closes, so
// the survivors, waiting in a collective on a frozen peer, leave the generation only because the
// agent started the next one). The survivors on node 0 shrink the world to 2 ranks, keeping the
// global batch, and restore from node 0's copy, which holds node 1's shards too: bitwise the run
// resumed at dp 2 from the uninterrupted run's checkpoint of the restored step.
class ElasticNodeLoss : public ElasticNodes, public ::testing::WithParamInterface<std::string> {};

TEST_P(ElasticNodeLoss, TheSurvivorsRestoreFromTheReplicaBitwise) {
  const bool frozen = GetParam() == "frozen";
  static const std::filesystem::path full = one_agent(
      4, "one_agent4", {"--set", "output.checkpoint_every=1", "--set", "output.keep_last=50"});
  const auto dir = out_dir("node_lost_" + GetParam());
  const int port = free_port();
  CliProcess other(agent(1, 2, port, dir, {}));
  CliProcess lead(agent(0, 2, port, dir, {"--min-ranks", "2"}));
  const auto metrics = dir / "out" / "metrics.jsonl";
  wait_for_step(metrics, 8);
  if (frozen) {
    ::kill(-other.pid(), SIGSTOP);  // the agent and its ranks: one process group
  } else {
    kill_node(other);
  }
  const CliResult r = lead.wait(kLimitS);
  if (frozen) {
    other.wait(0);  // killed, stopped as it is
    remove_job_dir(other.pid());
  }
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(node 1 \(host [^)]+\) lost: its agent sent nothing for)")))
      << r.err;
  EXPECT_NE(r.err.find("the job goes on with 2 ranks"), std::string::npos) << r.err;
  if (frozen) {
    // Not their collective deadline (parallel.timeout_s, 30 s): the next generation ended it.
    EXPECT_NE(r.err.find("the agent started generation 1"), std::string::npos) << r.err;
  }
  EXPECT_NE(r.out.find("global batch 12 kept"), std::string::npos) << r.out;
  const int restored = restored_step(r.out);
  EXPECT_GE(restored, 7) << r.out;  // lost after step 8 was logged: at most one step lost
  expect_loss_near(metrics, full);
  const auto resumed = out_dir("node_lost_resumed_" + GetParam());
  std::vector<std::string> args = {LATTICE_EXECUTABLE, "launch", "--nproc-per-node", "2", "--"};
  for (std::string& a :
       train(2, resumed / "out",
             {"--set", "batch.micro_batch=3", "--set", "batch.micro_batches=2", "--resume",
              (full / "checkpoints" / fmt::format("step_{}", restored)).string()})) {
    args.push_back(a);
  }
  const CliResult again = run_cli(args, kLimitS);
  ASSERT_EQ(again.exit_code, 0) << again.all();
  expect_same_final(dir / "out", resumed / "out", 2);
}

INSTANTIATE_TEST_SUITE_P(Node, ElasticNodeLoss, ::testing::Values("killed", "frozen"));

// Three nodes, one rank each: node 1 (the middle one) is lost after step 8 with its shared
// memory. No copy is whole: node 0's holds ranks 0 and 2, node 2's ranks 2 and 1. The survivors
// fill each other's copy, shrink to 2 ranks keeping the global batch and restore: bitwise the
// run resumed at dp 2 from the uninterrupted run's checkpoint of the restored step.
TEST_F(ElasticNodes, ThreeNodesLoseTheMiddleOneAndRestoreFromTheOthersCopiesBitwise) {
  const std::filesystem::path full = one_agent(
      3, "one_agent3", {"--set", "output.checkpoint_every=1", "--set", "output.keep_last=50"});
  const auto dir = out_dir("three_nodes");
  const int port = free_port();
  CliProcess middle(agent(1, 1, port, dir, {}, {}, 3));
  CliProcess last(agent(2, 1, port, dir, {}, {}, 3));
  CliProcess lead(agent(0, 1, port, dir, {"--min-ranks", "2"}, {}, 3));
  const auto metrics = dir / "out" / "metrics.jsonl";
  wait_for_step(metrics, 8);
  kill_node(middle);
  const CliResult r = lead.wait(kLimitS);
  const CliResult l = last.wait(kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  ASSERT_EQ(l.exit_code, 0) << l.all();
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(node 1 \(host [^)]+\) lost: its agent sent nothing for)")))
      << r.err;
  EXPECT_NE(r.err.find("the job goes on with 2 ranks"), std::string::npos) << r.err;
  // Each survivor's copy lacked the other's shard of the restored step.
  EXPECT_NE(r.all().find("rank 0: filled this node's copy"), std::string::npos) << r.all();
  EXPECT_NE(l.all().find("rank 1: filled this node's copy"), std::string::npos) << l.all();
  const int restored = restored_step(r.out);
  EXPECT_GE(restored, 7) << r.out;  // lost after step 8 was logged: at most one step lost
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.out, m, std::regex(R"(micro-batch 4 x 1 -> (\d+) x (\d+) per rank, global batch 12 kept)")))
      << r.out;
  const std::string micro_batch = m[1], micro_batches = m[2];
  expect_loss_near(metrics, full);
  const auto resumed = out_dir("three_nodes_resumed");
  std::vector<std::string> args = {LATTICE_EXECUTABLE, "launch", "--nproc-per-node", "2", "--"};
  for (std::string& a :
       train(2, resumed / "out",
             {"--set", "batch.micro_batch=" + micro_batch, "--set",
              "batch.micro_batches=" + micro_batches, "--resume",
              (full / "checkpoints" / fmt::format("step_{}", restored)).string()})) {
    args.push_back(a);
  }
  const CliResult again = run_cli(args, kLimitS);
  ASSERT_EQ(again.exit_code, 0) << again.all();
  expect_same_final(dir / "out", resumed / "out", 2);
}

// Nodes 1 and 2 of three lost together: rank 1's shards were on nodes 1 and 2 only, so node 0's
// copy cannot be made whole. The job ends in bounded time naming why and what to do instead of
// restoring a snapshot with a rank's state missing.
TEST_F(ElasticNodes, TwoNeighbouringNodesLostEndTheJobNamingTheDurableCheckpoints) {
  const auto dir = out_dir("three_nodes_two_lost");
  const int port = free_port();
  CliProcess middle(agent(1, 1, port, dir, {}, {}, 3));
  CliProcess last(agent(2, 1, port, dir, {}, {}, 3));
  CliProcess lead(agent(0, 1, port, dir, {"--min-ranks", "1"}, {}, 3));
  wait_for_step(dir / "out" / "metrics.jsonl", 6);
  kill_node(middle);
  kill_node(last);
  const CliResult r = lead.wait(kLimitS);
  EXPECT_NE(r.exit_code, 0) << r.all();
  EXPECT_FALSE(r.timed_out) << r.all();
  EXPECT_NE(r.all().find("is not whole even after filling it from the other nodes"),
            std::string::npos)
      << r.all();
  EXPECT_NE(r.all().find("two neighbouring nodes lost"), std::string::npos) << r.all();
}

// With two spares on each node, node 1's two ranks come back in node 0's spares: the world stays
// at 4 ranks, so the job ends bitwise as the uninterrupted one.
TEST_F(ElasticNodes, ALostNodesRanksTakeTheSparesOfTheOtherNodeBitwise) {
  const auto base = one_agent(4, "one_agent4_spares");
  const auto dir = out_dir("node_lost_spares");
  const int port = free_port();
  CliProcess other(agent(1, 2, port, dir, {}));
  CliProcess lead(agent(0, 2, port, dir, {"--spares", "2"}));
  const auto metrics = dir / "out" / "metrics.jsonl";
  wait_for_step(metrics, 6);
  kill_node(other);
  const CliResult r = lead.wait(kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(node 1 \(host [^)]+\) lost: its agent sent nothing for)")))
      << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err,
      std::regex(
          R"(generation 1: ranks 0 \(node 0, process 0, kept\), 1 \(node 0, process 1, kept\), 2 \(node 0, process \d+, a spare\), 3 \(node 0, process \d+, a spare\))")))
      << r.err;
  EXPECT_EQ(r.err.find("the job goes on with"), std::string::npos) << r.err;  // no shrink
  expect_same_final(dir / "out", base, 4);
}

// SIGTERM to agent 0 (a preemption) reaches every node's ranks: they finish the step, write one
// durable checkpoint together and exit 0, and both agents end 0; --resume auto then finishes
// bitwise as the uninterrupted job.
TEST_F(ElasticNodes, SigtermToAgentZeroCheckpointsEveryNodeAndResumesBitwise) {
  const auto base = one_agent(2, "one_agent2_term");
  const auto dir = out_dir("sigterm");
  const int port = free_port();
  CliProcess other(agent(1, 1, port, dir, {}));
  CliProcess lead(agent(0, 1, port, dir, {}));
  const auto metrics = dir / "out" / "metrics.jsonl";
  wait_for_step(metrics, 5);
  lead.signal(SIGTERM);
  const CliResult r = lead.wait(kLimitS);
  const CliResult o = other.wait(kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(o.exit_code, 0) << o.all();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("stopped by signal 15 after step (\\d+)")))
      << r.out;
  const std::string stopped = m[1];
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "checkpoints" / ("step_" + stopped)));
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "final"));
  const int port2 = free_port();
  CliProcess other2(agent(1, 1, port2, dir, {}, {"--resume", "auto"}));
  const CliResult again = run_cli(agent(0, 1, port2, dir, {}, {"--resume", "auto"}), kLimitS);
  const CliResult o2 = other2.wait(kLimitS);
  ASSERT_EQ(again.exit_code, 0) << again.all();
  EXPECT_EQ(o2.exit_code, 0) << o2.all();
  expect_same_final(dir / "out", base, 2);
}

// Agent 0 holds the store and the decisions: when it is killed, the other agent kills its ranks
// and ends non-zero within seconds, naming it, instead of leaving anything running.
TEST_F(ElasticNodes, AgentZeroLostEndsTheOtherAgentsAndTheirRanks) {
  const auto dir = out_dir("agent0_lost");
  const int port = free_port();
  CliProcess other(agent(1, 1, port, dir, {}));
  CliProcess lead(agent(0, 1, port, dir, {}));
  const auto metrics = dir / "out" / "metrics.jsonl";
  wait_for_step(metrics, 3);
  kill_node(lead);
  const CliResult o = other.wait(kLimitS);
  EXPECT_NE(o.exit_code, 0) << o.all();
  EXPECT_FALSE(o.timed_out) << o.all();
  EXPECT_NE(o.err.find("the job ends here ---> HINT: agent 0 (127.0.0.1:"), std::string::npos)
      << o.err;
}

// An agent with another secret is refused by the store (its error says so) and agent 0 logs the
// refused address; agent 0 then ends naming the node that never arrived.
TEST_F(ElasticNodes, AnAgentWithoutTheJobsSecretIsRefusedAndLogged) {
  const auto dir = out_dir("stranger");
  const int port = free_port();
  CliProcess lead(agent(0, 1, port, dir, {"--rdzv-timeout-s", "4"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const CliResult stranger = run_cli(agent(1, 1, port, dir, {"--rdzv-timeout-s", "4"}), kLimitS,
                                     {"LATTICE_JOB_SECRET=not-the-jobs-secret-but-32-chars-long"});
  const CliResult r = lead.wait(kLimitS);
  EXPECT_EQ(stranger.exit_code, 3) << stranger.all();  // refused: a ConfigError
  EXPECT_NE(stranger.err.find("refused this process"), std::string::npos) << stranger.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(std::regex_search(
      r.err,
      std::regex(
          R"(the job's store refused a connection from 127\.0\.0\.1:\d+ \(\d+ attempt\(s\) with a wrong secret\))")))
      << r.err;
  EXPECT_NE(r.err.find("the agents of node(s) 1 did not arrive"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lattice::testing
