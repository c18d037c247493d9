#include "comm/thread_transport.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "comm/reduce_kernels.h"
#include "core/philox.h"

namespace lattice {

class ThreadPendingSend : public PendingSend {
 public:
  ThreadPendingSend(std::shared_ptr<ThreadHub> hub, int dst,
                    std::shared_ptr<ThreadHub::Message> message)
      : hub_(std::move(hub)), dst_(dst), message_(std::move(message)) {}
  ~ThreadPendingSend() override { finish(CommClock::time_point::max(), /*withdraw=*/true); }

  void wait(Deadline deadline) override {
    if (!finish(deadline, /*withdraw=*/false)) {
      if (hub_->aborted()) hub_->throw_aborted();
      throw PeerTimeout(dst_, fmt::format("rank {} did not receive", dst_));
    }
  }

 private:
  // Returns true when the receiver has the bytes. On a missed deadline (or abort, or from the
  // destructor) a message not yet taken is withdrawn; one being copied is waited for, because
  // the receiver is reading the sender's memory.
  bool finish(Deadline deadline, bool withdraw) noexcept {
    if (message_ == nullptr) return true;
    ThreadHub::Mailbox& box = *hub_->mailboxes_[dst_];
    using State = ThreadHub::State;
    if (!withdraw) {
      const auto spin_until = CommClock::now() + ThreadHub::kSpinBeforeBlocking;
      while (message_->state.load(std::memory_order_acquire) != State::kDone &&
             CommClock::now() < spin_until) {
        std::this_thread::yield();
      }
    }
    std::unique_lock lock(box.mutex);
    if (!withdraw) {
      box.cv.wait_until(lock, deadline,
                        [&] { return message_->state == State::kDone || hub_->aborted(); });
    }
    if (message_->state == State::kPosted) {
      box.posted.remove(message_);
      message_->state = State::kWithdrawn;
    }
    box.cv.wait(lock, [&] { return message_->state != State::kTaking; });
    bool done = message_->state == State::kDone;
    message_.reset();
    return done;
  }

  std::shared_ptr<ThreadHub> hub_;
  int dst_;
  std::shared_ptr<ThreadHub::Message> message_;
};

class ThreadTransport : public Transport {
 public:
  ThreadTransport(std::shared_ptr<ThreadHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  TransportKind kind() const override { return TransportKind::kThreads; }
  int world_rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size(); }

  PendingSendPtr post_send(int peer, MessageKey key, const void* data, size_t bytes) override {
    return hub_->post(rank_, peer, key, data, bytes);
  }

  void recv(int peer, MessageKey key, void* data, size_t bytes, Deadline deadline) override {
    hub_->take(rank_, peer, key, bytes, deadline, [&](const void* src) {
      if (bytes > 0) std::memcpy(data, src, bytes);  // memcpy of null is UB, even for 0
    });
  }

  void recv_reduce(int peer, MessageKey key, void* acc, int64_t count, DType dtype, ReduceOp op,
                   Deadline deadline) override {
    hub_->take(rank_, peer, key, size_t(count) * dtype_size(dtype), deadline,
               [&](const void* src) { reduce_into(acc, src, count, dtype, op); });
  }

  void mark_arrival(uint64_t context, uint64_t seq) override {
    std::lock_guard lock(hub_->board_mutex_);
    uint64_t& last = hub_->arrivals_[context][rank_];
    last = std::max(last, seq);
  }

  std::optional<std::vector<int>> missing_ranks(uint64_t context, uint64_t seq,
                                                const std::vector<int>& members) override {
    std::lock_guard lock(hub_->board_mutex_);
    const auto& board = hub_->arrivals_[context];
    std::vector<int> missing;
    for (size_t i = 0; i < members.size(); ++i) {
      auto it = board.find(members[i]);
      if (it == board.end() || it->second < seq) missing.push_back(int(i));
    }
    return missing;
  }

 private:
  std::shared_ptr<ThreadHub> hub_;
  int rank_;
};

ThreadHub::ThreadHub(int world_size)
    : world_size_(world_size), link_delay_us_(size_t(world_size) * size_t(world_size)) {
  LATTICE_CHECK_GE(world_size, 1);
  for (int i = 0; i < world_size; ++i) mailboxes_.push_back(std::make_unique<Mailbox>());
}

std::shared_ptr<Transport> ThreadHub::transport(int rank) {
  LATTICE_CHECK(rank >= 0 && rank < world_size_, "rank {} of {}", rank, world_size_);
  return std::make_shared<ThreadTransport>(shared_from_this(), rank);
}

void ThreadHub::abort(int failed_rank, const std::string& why) {
  {
    std::lock_guard lock(abort_mutex_);
    if (aborted_.load()) return;
    abort_reason_ = fmt::format("rank {} failed: {}", failed_rank, why);
    aborted_.store(true, std::memory_order_release);
  }
  for (auto& box : mailboxes_) {
    std::lock_guard lock(box->mutex);  // no waiter can miss the wake-up between check and wait
    box->cv.notify_all();
  }
}

void ThreadHub::throw_aborted() const {
  std::lock_guard lock(abort_mutex_);
  LATTICE_THROW(CommError, "communication aborted because {}", abort_reason_);
}

void ThreadHub::set_link_delay(int src, int dst, std::chrono::microseconds delay) {
  LATTICE_CHECK(src >= 0 && src < world_size_ && dst >= 0 && dst < world_size_);
  link_delay_us_[size_t(src) * size_t(world_size_) + size_t(dst)].store(delay.count());
}

void ThreadHub::set_noise(double probability, std::chrono::microseconds delay, uint64_t seed,
                          uint64_t period) {
  LATTICE_CHECK(probability >= 0.0 && probability <= 1.0);
  noise_seed_.store(seed);
  noise_period_.store(period);
  noise_delay_us_.store(delay.count());
  noise_threshold_.store(uint32_t(std::min(probability * 4294967296.0, 4294967295.0)));
}

PendingSendPtr ThreadHub::post(int src, int dst, MessageKey key, const void* data, size_t bytes) {
  LATTICE_CHECK(dst >= 0 && dst < world_size_, "send to rank {} of {}", dst, world_size_);
  if (aborted()) throw_aborted();
  auto message = std::make_shared<Message>();
  message->src = src;
  message->key = key;
  message->data = data;
  message->bytes = bytes;
  Mailbox& box = *mailboxes_[dst];
  {
    std::lock_guard lock(box.mutex);
    box.posted.push_back(message);
    box.version.fetch_add(1, std::memory_order_release);
  }
  box.cv.notify_all();
  return std::make_unique<ThreadPendingSend>(shared_from_this(), dst, std::move(message));
}

template <class Consume>
void ThreadHub::take(int dst, int src, MessageKey key, size_t expected_bytes, Deadline deadline,
                     Consume consume) {
  LATTICE_CHECK(src >= 0 && src < world_size_, "receive from rank {} of {}", src, world_size_);
  Mailbox& box = *mailboxes_[dst];
  std::shared_ptr<Message> message;
  {
    std::unique_lock lock(box.mutex);
    auto match = [&] {
      return std::find_if(box.posted.begin(), box.posted.end(),
                          [&](const auto& m) { return m->src == src && m->key == key; });
    };
    auto it = box.posted.end();
    box.cv.wait_until(lock, deadline, [&] {
      it = match();
      return it != box.posted.end() || aborted();
    });
    if (it == box.posted.end()) {
      if (aborted()) throw_aborted();
      throw PeerTimeout(src, fmt::format("rank {} did not send", src));
    }
    message = *it;
    box.posted.erase(it);
    message->state = State::kTaking;
  }
  int64_t delay_us = link_delay_us_[size_t(src) * size_t(world_size_) + size_t(dst)].load();
  if (const uint32_t threshold = noise_threshold_.load(); threshold > 0) {
    const uint64_t n = noise_draws_.fetch_add(1), period = noise_period_.load();
    PhiloxStream draw(noise_seed_.load(), 0x6e6f697365, n);
    const bool bursting = period == 0 || (n / period) % 2 == 0;
    if (bursting && draw.next_u32() < threshold) delay_us += noise_delay_us_.load();
  }
  if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
  bool size_matches = message->bytes == expected_bytes;
  if (size_matches) consume(message->data);
  {
    std::lock_guard lock(box.mutex);
    message->state = State::kDone;
  }
  box.cv.notify_all();
  if (!size_matches) {
    LATTICE_THROW(CommError,
                  "rank {} sent {} bytes where rank {} expected {} ---> HINT: every rank of a "
                  "collective must pass the same count and dtype",
                  src, message->bytes, dst, expected_bytes);
  }
}

}  // namespace lattice
