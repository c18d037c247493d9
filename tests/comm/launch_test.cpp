// launch_ranks: the threads path runs the body once per rank on a working world with the
// caller's CommConfig, the gloo path on a one-rank world from lattice launch's variables, and
// every way of asking for a world that cannot be started is refused with a ConfigError naming
// the fix. (The mpi success path runs under mpirun, not here.)
#include "comm/launch.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return {};
}

TEST(Launch, ThreadsRunTheBodyOncePerRankOnOneWorld) {
  for (int n : {1, 3, 4}) {
    std::mutex mutex;
    std::vector<int> ranks_seen;
    launch_ranks(TransportKind::kThreads, n, [&](Communicator& world) {
      EXPECT_EQ(world.size(), n);
      EXPECT_EQ(world.transport_kind(), TransportKind::kThreads);
      float x = float(world.rank());
      world.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
      EXPECT_EQ(x, float(n * (n - 1) / 2));
      std::lock_guard lock(mutex);
      ranks_seen.push_back(world.rank());
    });
    std::sort(ranks_seen.begin(), ranks_seen.end());
    std::vector<int> expected(static_cast<size_t>(n));
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(ranks_seen, expected) << n << " ranks";
  }
}

TEST(Launch, ThreadsUseTheCallersCommConfig) {
  // Rank 1 skips the all_reduce: rank 0 must give up after the configured 150 ms (the default
  // would be 30 s), which its timeout message states.
  CommConfig config;
  config.timeout = std::chrono::milliseconds(150);
  std::string what;
  launch_ranks(
      TransportKind::kThreads, 2,
      [&](Communicator& world) {
        if (world.rank() != 0) return;
        float x = 1;
        try {
          world.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
        } catch (const TimeoutError& e) {
          what = e.what();
        }
      },
      config);
  EXPECT_NE(what.find("timed out after 150 ms"), std::string::npos) << what;
}

TEST(Launch, ThreadsRethrowARanksException) {
  EXPECT_THROW(launch_ranks(TransportKind::kThreads, 3,
                            [](Communicator& world) {
                              if (world.rank() == 2) LATTICE_THROW(ValueError, "rank 2 failed");
                            }),
               ValueError);
}

TEST(Launch, RefusesAnEmptyWorldOnEitherTransport) {
  std::atomic<int> ran{0};
  auto body = [&](Communicator&) { ++ran; };
  EXPECT_NE(message_of([&] { launch_ranks(TransportKind::kThreads, 0, body); }).find("0 ranks"),
            std::string::npos);
  EXPECT_THROW(launch_ranks(TransportKind::kMpi, -2, body), ConfigError);
  EXPECT_EQ(ran.load(), 0);
}

TEST(Launch, MpiWithoutALauncherNamesMpirun) {
  const std::string what = message_of([] { require_mpi_launch(std::nullopt, 4); });
  EXPECT_NE(what.find("mpirun -np 4"), std::string::npos) << what;
  EXPECT_NE(what.find("--transport threads"), std::string::npos) << what;
}

TEST(Launch, MpiWithTheWrongProcessCountNamesBoth) {
  LaunchEnvironment env;
  env.launcher = "openmpi";
  env.rank = 1;
  env.size = 2;
  const std::string what = message_of([&] { require_mpi_launch(env, 8); });
  EXPECT_NE(what.find("needs 8 processes"), std::string::npos) << what;
  EXPECT_NE(what.find("openmpi launcher started 2"), std::string::npos) << what;
  EXPECT_NE(what.find("mpirun -np 8"), std::string::npos) << what;
  EXPECT_EQ(require_mpi_launch(env, 2).rank, 1);
}

TEST(Launch, MpiInAProcessStartedByHandRefusesBeforeStartingMpi) {
  if (detect_launch_environment().has_value()) {
    GTEST_SKIP() << "this test process was started by a launcher";
  }
  std::atomic<int> ran{0};
  const std::string what =
      message_of([&] { launch_ranks(TransportKind::kMpi, 2, [&](Communicator&) { ++ran; }); });
  EXPECT_NE(what.find("mpirun -np 2"), std::string::npos) << what;
  EXPECT_EQ(ran.load(), 0);
}

TEST(Launch, GlooWithoutLatticeLaunchNamesIt) {
  const std::string what = message_of([] { require_gloo_launch(std::nullopt, 4); });
  EXPECT_NE(what.find("lattice launch --nproc-per-node 4 -- train"), std::string::npos) << what;
  EXPECT_NE(what.find("--transport threads"), std::string::npos) << what;
}

TEST(Launch, GlooWithTheWrongProcessCountNamesBoth) {
  GlooLaunchEnvironment env;
  env.rank = 1;
  env.size = 2;
  env.store = "/tmp/store";
  const std::string what = message_of([&] { require_gloo_launch(env, 8); });
  EXPECT_NE(what.find("needs 8 processes"), std::string::npos) << what;
  EXPECT_NE(what.find("lattice launch started 2"), std::string::npos) << what;
  EXPECT_NE(what.find("--nproc-per-node 8"), std::string::npos) << what;
  EXPECT_EQ(require_gloo_launch(env, 2).rank, 1);
}

TEST(Launch, GlooInAProcessStartedByHandRefuses) {
  if (detect_gloo_environment().has_value()) {
    GTEST_SKIP() << "this test process was started by lattice launch";
  }
  std::atomic<int> ran{0};
  const std::string what =
      message_of([&] { launch_ranks(TransportKind::kGloo, 2, [&](Communicator&) { ++ran; }); });
  EXPECT_NE(what.find("lattice launch --nproc-per-node 2"), std::string::npos) << what;
  EXPECT_EQ(ran.load(), 0);
}

// The whole gloo path of launch_ranks on a world of one, from the variables lattice launch sets.
TEST(Launch, GlooRunsTheBodyOnTheLaunchersWorld) {
  if (detect_gloo_environment().has_value()) {
    GTEST_SKIP() << "this test process was started by lattice launch";
  }
  const auto dir = testing::scratch_dir("launch_gloo_store");
  const std::pair<const char*, std::string> vars[] = {{"LATTICE_RANK", "0"},
                                                      {"LATTICE_WORLD_SIZE", "1"},
                                                      {"LATTICE_LOCAL_RANK", "0"},
                                                      {"LATTICE_STORE", dir.string()},
                                                      {"LATTICE_GENERATION", "4"}};
  for (const auto& [name, value] : vars) ::setenv(name, value.c_str(), 1);
  int ran = 0;
  CommConfig config;
  config.timeout = std::chrono::milliseconds(5000);
  try {
    launch_ranks(
        TransportKind::kGloo, 1,
        [&](Communicator& world) {
          EXPECT_EQ(world.size(), 1);
          EXPECT_EQ(world.transport_kind(), TransportKind::kGloo);
          float x = 3;
          world.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
          EXPECT_EQ(x, 3.0f);
          ++ran;
        },
        config);
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  for (const auto& [name, value] : vars) ::unsetenv(name);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(ran, 1);
}

TEST(Launch, TransportNamesParse) {
  EXPECT_EQ(parse_transport("threads"), TransportKind::kThreads);
  EXPECT_EQ(parse_transport("mpi"), TransportKind::kMpi);
  EXPECT_EQ(parse_transport("gloo"), TransportKind::kGloo);
  for (int i = 0; i < kTransportCount; ++i) {
    EXPECT_EQ(parse_transport(transport_name(TransportKind(i))), TransportKind(i));
  }
  try {
    parse_transport("nccl");
    FAIL() << "parsed 'nccl'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'nccl'"), std::string::npos) << what;
    EXPECT_NE(what.find("threads, mpi or gloo"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace lattice
