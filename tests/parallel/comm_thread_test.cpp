// The communication thread runs tasks in submission order and reports the first failure.
#include "parallel/comm_thread.h"

#include <gtest/gtest.h>

#include <future>
#include <stdexcept>
#include <vector>

namespace lattice {
namespace {

TEST(CommThread, RunsTasksInOrderAndWaitSeesThemAll) {
  CommThread thread;
  std::vector<int> order;  // touched only by the comm thread until wait() returns
  for (int i = 0; i < 50; ++i) thread.submit([&order, i] { order.push_back(i); });
  thread.wait();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[size_t(i)], i);
  thread.submit([&order] { order.push_back(99); });
  thread.wait();
  EXPECT_EQ(order.back(), 99);
}

TEST(CommThread, RethrowsTheFirstFailureAndDropsTheRest) {
  CommThread thread;
  int ran = 0;
  std::promise<void> both_queued;
  std::shared_future<void> gate = both_queued.get_future().share();
  // The failing task waits until the second is queued, so "dropped" is not a race.
  thread.submit([gate] {
    gate.wait();
    throw std::runtime_error("bucket 3 failed");
  });
  thread.submit([&ran] { ++ran; });
  both_queued.set_value();
  try {
    thread.wait();
    FAIL() << "wait() should rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "bucket 3 failed");
  }
  EXPECT_EQ(ran, 0);
  thread.submit([&ran] { ++ran; });  // usable again after the failure was reported
  thread.wait();
  EXPECT_EQ(ran, 1);
}

}  // namespace
}  // namespace lattice
