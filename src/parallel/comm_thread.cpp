#include "parallel/comm_thread.h"

#include "core/thread_budget.h"

namespace lattice {

CommThread::CommThread() : thread_([this](std::stop_token stop) { loop(stop); }) {}

CommThread::~CommThread() {
  thread_.request_stop();
  work_ready_.notify_all();
}

void CommThread::submit(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
  }
  work_ready_.notify_one();
}

void CommThread::wait() {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

bool CommThread::failed() {
  std::lock_guard lock(mutex_);
  return error_ != nullptr;
}

void CommThread::loop(std::stop_token stop) {
  // Reduction loops of the collectives stay on this thread: the rank's cores belong to compute.
  set_thread_budget(1);
  std::unique_lock lock(mutex_);
  while (true) {
    // On destruction, queued work is dropped: its peers are gone or will time out anyway.
    if (!work_ready_.wait(lock, stop, [this] { return !queue_.empty(); })) return;
    if (stop.stop_requested()) return;
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    --running_;
    if (error) {
      if (!error_) error_ = error;
      queue_.clear();
    }
    if (queue_.empty() && running_ == 0) done_.notify_all();
  }
}

}  // namespace lattice
