// Timeouts, never hangs: a rank that skips a collective ends in a TimeoutError on every other
// rank naming the collective, the group, the sequence number and the missing rank.
#include <gtest/gtest.h>

#include <mutex>
#include <stdexcept>

#include "comm/thread_world.h"

namespace lattice {
namespace {

constexpr auto kShortTimeout = std::chrono::milliseconds(500);

TEST(CommTimeout, RankSkippingACollectiveFailsEveryOtherRank) {
  for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree}) {
    std::mutex mutex;
    std::vector<std::string> errors;
    run_ranks(4, [&](Communicator& comm) {
      std::vector<float> data(1000, 1.0f);
      CollectiveOptions options;
      options.timeout = kShortTimeout;
      options.algorithm = a;
      comm.all_reduce(data.data(), 1000, DType::kF32, ReduceOp::kSum, options);  // seq 1
      if (comm.rank() == 3) return;                                              // skips seq 2
      try {
        comm.all_reduce(data.data(), 1000, DType::kF32, ReduceOp::kSum, options);
        ADD_FAILURE() << "rank " << comm.rank() << " completed an all_reduce rank 3 skipped";
      } catch (const TimeoutError& e) {
        std::lock_guard lock(mutex);
        errors.push_back(e.what());
      }
    });
    ASSERT_EQ(errors.size(), 3u) << algorithm_name(a);
    for (const std::string& e : errors) {
      EXPECT_NE(e.find("all_reduce on group 'world'"), std::string::npos) << e;
      EXPECT_NE(e.find("sequence number 2"), std::string::npos) << e;
      EXPECT_NE(e.find("ranks [3] did not arrive"), std::string::npos) << e;
      EXPECT_NE(e.find("500 ms"), std::string::npos) << e;
    }
  }
}

TEST(CommTimeout, NamesTheSubgroup) {
  std::mutex mutex;
  std::vector<std::string> errors;
  run_ranks(4, [&](Communicator& comm) {
    auto odd = comm.new_group({1, 3});
    if (!odd || comm.rank() == 3) return;
    float x = 1;
    CollectiveOptions options;
    options.timeout = kShortTimeout;
    try {
      odd->broadcast(&x, 1, DType::kF32, 0, options);
      ADD_FAILURE() << "broadcast completed without rank 3";
    } catch (const TimeoutError& e) {
      std::lock_guard lock(mutex);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("broadcast on group 'world/group[1, 3]'"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("ranks [1] did not arrive"), std::string::npos) << errors[0];
}

TEST(CommTimeout, RecvWithoutSendTimesOut) {
  run_ranks(2, [](Communicator& comm) {
    if (comm.rank() == 1) return;
    float x = 0;
    CollectiveOptions options;
    options.timeout = std::chrono::milliseconds(100);
    options.tag = 7;
    try {
      comm.recv(&x, 1, DType::kF32, 1, options);
      ADD_FAILURE() << "recv completed without a send";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("recv (tag 7)"), std::string::npos) << e.what();
    }
  });
}

// A rank that fails wakes the others at once (they would otherwise wait for a 60 s deadline),
// and run_ranks rethrows the first error.
TEST(CommTimeout, FailingRankAbortsTheOthers) {
  CommConfig config;
  config.timeout = std::chrono::milliseconds(60000);
  ThreadWorldOptions world;
  world.config = config;
  try {
    run_ranks(
        3,
        [](Communicator& comm) {
          if (comm.rank() == 1) throw std::runtime_error("rank 1 broke");
          comm.barrier();
        },
        world);
    FAIL() << "run_ranks did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank 1 broke");
  }
}

}  // namespace
}  // namespace lattice
