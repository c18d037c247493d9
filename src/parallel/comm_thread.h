// A rank's communication thread: runs queued collectives in submission order while the rank's
// compute thread goes on with backward, so gradient reduction overlaps compute.
//
// One Communicator must not be used by two threads at once: while work is queued, only this
// thread touches it; the compute thread uses it again after wait().
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace lattice {

class CommThread {
 public:
  CommThread();
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `task`; tasks run one at a time, in the order submitted.
  void submit(std::function<void()> task);
  // Blocks until every submitted task has run; rethrows the first task's exception (the tasks
  // queued after a failed one are dropped, since their peers will not match them).
  void wait();
  // True once a task has failed (until wait() rethrows it): whoever waits for one task's effect
  // must stop waiting, since the tasks after it were dropped.
  bool failed();

 private:
  void loop(std::stop_token stop);

  std::mutex mutex_;
  std::condition_variable_any work_ready_;
  std::condition_variable done_;
  std::deque<std::function<void()>> queue_;
  int running_ = 0;
  std::exception_ptr error_;
  std::jthread thread_;  // last: starts after the members above exist
};

}  // namespace lattice
