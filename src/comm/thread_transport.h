// The `threads` transport: N ranks as threads of one process, exchanging through shared memory.
//
// A send posts a pointer to the sender's buffer in the receiver's mailbox; the receiver copies
// (or reduces) straight out of it, so each message costs one pass over the bytes and no staging
// copy. The sender's wait returns once the receiver is done with the buffer. Waits spin for at
// most kSpinBeforeBlocking, yielding the core, then block on condition variables with deadlines
// (8 rank threads on 2 cores must not spin).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/transport.h"

namespace lattice {

class ThreadHub : public std::enable_shared_from_this<ThreadHub> {
 public:
  explicit ThreadHub(int world_size);
  ThreadHub(const ThreadHub&) = delete;
  ThreadHub& operator=(const ThreadHub&) = delete;

  int world_size() const { return world_size_; }
  // The transport rank `rank` uses; the hub must outlive it (it holds a shared_ptr).
  std::shared_ptr<Transport> transport(int rank);

  // Wakes every blocked rank with a CommError naming the failed rank; later calls fail at once.
  void abort(int failed_rank, const std::string& why);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // Test hook: every message from src to dst is delivered `delay` late (a slow link).
  void set_link_delay(int src, int dst, std::chrono::microseconds delay);
  // Test hook: a noisy network: every message between any two ranks is, with `probability`,
  // delivered `delay` late (cross traffic), drawn from a Philox stream of `seed`; with `period`
  // > 0 only in bursts, the first `period` messages of every 2 × `period` (traffic that comes
  // and goes, so the time a window measured is not the next one's).
  void set_noise(double probability, std::chrono::microseconds delay, uint64_t seed,
                 uint64_t period = 0);

 private:
  friend class ThreadTransport;
  friend class ThreadPendingSend;
  enum class State : uint8_t { kPosted, kTaking, kDone, kWithdrawn };
  struct Message {
    int src = 0;
    MessageKey key;
    const void* data = nullptr;
    size_t bytes = 0;
    std::atomic<State> state{State::kPosted};  // written under the mailbox mutex
  };
  struct Mailbox {
    std::mutex mutex;
    std::condition_variable cv;
    std::list<std::shared_ptr<Message>> posted;
    std::atomic<uint64_t> version{0};  // bumped on every post, so a spinning receiver sees news
  };
  // Waits briefly without sleeping before blocking: a futex sleep and wake-up costs tens of
  // microseconds, more than a small message takes, when the peer is running.
  static constexpr std::chrono::microseconds kSpinBeforeBlocking{50};

  PendingSendPtr post(int src, int dst, MessageKey key, const void* data, size_t bytes);
  // Finds the message from `src` with `key` in dst's mailbox and applies `consume` to its bytes.
  template <class Consume>
  void take(int dst, int src, MessageKey key, size_t expected_bytes, Deadline deadline,
            Consume consume);
  [[noreturn]] void throw_aborted() const;

  int world_size_;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mutex_;
  std::string abort_reason_;
  std::vector<std::atomic<int64_t>> link_delay_us_;  // [src * n + dst]
  std::atomic<uint32_t> noise_threshold_{0};         // a draw below it is delayed; 0: none
  std::atomic<int64_t> noise_delay_us_{0};
  std::atomic<uint64_t> noise_seed_{0}, noise_draws_{0}, noise_period_{0};
  std::mutex board_mutex_;
  std::map<uint64_t, std::map<int, uint64_t>> arrivals_;  // context -> world rank -> last seq
};

}  // namespace lattice
