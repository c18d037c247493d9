// The gloo transport over real TCP connections on the loopback: N ranks as threads of this
// process, each with its own GlooTransport, meeting in one in-process store. Every collective and
// algorithm against the bitwise reference the threads suite uses, the same bytes as the threads
// transport for a mixed script, groups, two threads of a rank at once, and every failure ending
// in an error within a bounded time: a silent peer, a dead peer, a size mismatch, a dropped send
// and a rank that never arrives at the rendezvous.
#include "comm/gloo_transport.h"

#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <latch>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "collective_check.h"
#include "comm/thread_world.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct GlooWorldOptions {
  CommConfig config;
  std::chrono::milliseconds rendezvous{10000};
};

// Gloo's spawn on the gloo transport: runs `body` on n ranks, each a thread with its own
// transport, and rethrows the first exception once every rank has stopped. A rank's transport
// is destroyed when its body returns or throws, as when a process exits: peers still waiting on
// it fail at once.
void run_gloo_transports(int n, const std::function<void(std::shared_ptr<GlooTransport>)>& body,
                         const GlooWorldOptions& options = {}) {
  gloo::rendezvous::HashStore store;
  std::mutex mutex;
  std::exception_ptr first_error;
  auto rank_main = [&](int rank) {
    try {
      GlooOptions o;
      o.rank = rank;
      o.size = n;
      o.timeout = options.rendezvous;
      body(GlooTransport::create(store, o));
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!first_error) first_error = std::current_exception();
    }
  };
  std::vector<std::jthread> threads;
  for (int r = 1; r < n; ++r) threads.emplace_back(rank_main, r);
  rank_main(0);
  threads.clear();
  if (first_error) std::rethrow_exception(first_error);
}

// run_ranks (thread_world.h) with a world Communicator on the gloo transport.
void run_gloo_ranks(int n, const std::function<void(Communicator&)>& body,
                    const GlooWorldOptions& options = {}) {
  run_gloo_transports(
      n,
      [&](std::shared_ptr<GlooTransport> transport) {
        Communicator world(std::move(transport), options.config);
        body(world);
      },
      options);
}

// Counts a latch down when the scope ends, however it ends: a rank that waits on the latch must
// not hang because the rank that should release it failed.
struct CountDownAtExit {
  std::latch& latch;
  ~CountDownAtExit() { latch.count_down(); }
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- every collective and algorithm, bit for bit ----

constexpr Collective kCollectives[] = {Collective::kAllReduce, Collective::kReduceScatter,
                                       Collective::kAllGather, Collective::kBroadcast,
                                       Collective::kReduce};
constexpr Algorithm kAlgorithms[] = {Algorithm::kRing, Algorithm::kHalvingDoubling,
                                     Algorithm::kTree, Algorithm::kAuto};

class GlooCollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectiveTest, EveryCollectiveAndAlgorithmMatchesTheReferenceBitwise) {
  const int n = GetParam();
  std::atomic<int> checks{0};
  run_gloo_ranks(n, [&](Communicator& comm) {
    for (Collective c : kCollectives) {
      for (Algorithm a : kAlgorithms) checks += testing::check_collective_bitwise(comm, c, a);
    }
    checks += testing::check_collective_bitwise(comm, Collective::kAllToAll, Algorithm::kAuto);
  });
  // Per rank and algorithm: 4 counts x 2 dtypes x 2 ops for the three reducing collectives,
  // x 1 op for all_gather and broadcast; all_to_all: 3 sizes x 2 dtypes.
  EXPECT_EQ(checks.load(), n * (4 * (3 * 16 + 2 * 8) + 6));
}

INSTANTIATE_TEST_SUITE_P(Gloo, GlooCollectiveTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// One rank's results of a mixed script: tuned (kAuto) and forced algorithms, both dtypes,
// groups, point-to-point. Each result is appended as bytes.
std::vector<std::vector<std::byte>> run_script(Communicator& world) {
  using testing::contributions;
  using testing::encode;
  const int n = world.size(), r = world.rank();
  std::vector<std::vector<std::byte>> out;
  CollectiveOptions forced;
  auto x = encode(contributions(r, 0, 1000), DType::kF32);
  world.all_reduce(x.data(), 1000, DType::kF32, ReduceOp::kSum);
  out.push_back(x);
  auto y = encode(contributions(r, 5, 3001), DType::kBF16);
  world.all_reduce(y.data(), 3001, DType::kBF16, ReduceOp::kMax);
  out.push_back(y);
  auto in = encode(contributions(r, 0, 7 * n), DType::kBF16);
  std::vector<std::byte> shard(7 * 2);
  forced.algorithm = Algorithm::kHalvingDoubling;
  world.reduce_scatter(in.data(), shard.data(), 7, DType::kBF16, ReduceOp::kSum, forced);
  out.push_back(shard);
  std::vector<std::byte> gathered(size_t(5 * n) * 4);
  auto mine = encode(contributions(r, 100, 5), DType::kF32);
  forced.algorithm = Algorithm::kTree;
  world.all_gather(mine.data(), gathered.data(), 5, DType::kF32, forced);
  out.push_back(gathered);
  auto b = encode(contributions(r, 9, 333), DType::kF32);
  forced.algorithm = Algorithm::kRing;
  world.broadcast(b.data(), 333, DType::kF32, 1 % n, forced);
  out.push_back(b);
  auto red = encode(std::vector<float>(77, -1.0f), DType::kF32);
  auto src = encode(contributions(r, 3, 77), DType::kF32);
  world.reduce(src.data(), red.data(), 77, DType::kF32, n - 1, ReduceOp::kSum);
  out.push_back(red);
  Communicator half = world.split(r % 2, -r);
  auto h = encode(contributions(r, 0, 64), DType::kF32);
  half.all_reduce(h.data(), 64, DType::kF32, ReduceOp::kSum);
  out.push_back(h);
  CollectiveOptions tagged;
  tagged.tag = 5;
  auto message = encode(contributions(r, 50, 10), DType::kF32);
  std::vector<std::byte> received(40);
  if (r == 0) {
    world.send(message.data(), 10, DType::kF32, (r + 1) % n, tagged);
    world.recv(received.data(), 10, DType::kF32, (r + n - 1) % n, tagged);
  } else {
    world.recv(received.data(), 10, DType::kF32, (r + n - 1) % n, tagged);
    world.send(message.data(), 10, DType::kF32, (r + 1) % n, tagged);
  }
  out.push_back(received);
  world.barrier();
  return out;
}

TEST(GlooCollectives, GiveTheSameBytesAsTheThreadsTransport) {
  for (int n : {2, 3, 4}) {
    std::vector<std::vector<std::vector<std::byte>>> threads(static_cast<size_t>(n)),
        gloo(static_cast<size_t>(n));
    run_ranks(n, [&](Communicator& comm) { threads[size_t(comm.rank())] = run_script(comm); });
    run_gloo_ranks(n, [&](Communicator& comm) {
      EXPECT_EQ(comm.transport_kind(), TransportKind::kGloo);
      gloo[size_t(comm.rank())] = run_script(comm);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(gloo[size_t(r)].size(), threads[size_t(r)].size()) << "n=" << n;
      for (size_t i = 0; i < gloo[size_t(r)].size(); ++i) {
        EXPECT_EQ(gloo[size_t(r)][i], threads[size_t(r)][i])
            << "n=" << n << " rank " << r << " result " << i;
      }
    }
  }
}

TEST(GlooCollectives, BarrierAndSendAsync) {
  std::atomic<int> arrived{0};
  run_gloo_ranks(4, [&](Communicator& comm) {
    ++arrived;
    comm.barrier();
    EXPECT_EQ(arrived.load(), 4);
    comm.barrier();  // keeps the counter stable until everyone checked it
    // Every rank posts its send to the next before receiving from the previous (a pipeline's
    // neighbour exchange): only a non-blocking send lets this finish.
    Arena arena("test");
    Tensor out = Tensor::empty(arena, {6}, DType::kF32);
    Tensor in = Tensor::empty(arena, {6}, DType::kF32);
    for (int64_t i = 0; i < 6; ++i) out.data<float>()[i] = float(comm.rank() * 10 + i);
    CollectiveOptions options;
    options.tag = 3;
    auto handle = comm.send_async(out, (comm.rank() + 1) % 4, options);
    comm.recv(in, (comm.rank() + 3) % 4, options);
    handle.wait();
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_EQ(in.data<float>()[i], float((comm.rank() + 3) % 4 * 10 + i));
    }
  });
}

// A recv takes the send with its tag, not the oldest one: the tag is part of the slot.
TEST(GlooPointToPoint, TagsPairSendsWithRecvsInAnyOrder) {
  run_gloo_ranks(2, [](Communicator& comm) {
    Arena arena("test");
    std::vector<Tensor> messages;
    for (int m = 0; m < 3; ++m) {
      messages.push_back(Tensor::empty(arena, {4}, DType::kF32));
      for (int64_t i = 0; i < 4; ++i) messages.back().data<float>()[i] = float(10 * m + i);
    }
    CollectiveOptions options;
    if (comm.rank() == 0) {
      std::vector<Communicator::SendHandle> sends;
      for (uint32_t tag = 0; tag < 3; ++tag) {
        options.tag = 100 + tag;
        sends.push_back(comm.send_async(messages[tag], 1, options));
      }
      for (auto& send : sends) send.wait();
    } else {
      for (uint32_t tag : {2u, 0u, 1u}) {
        std::vector<float> got(4, -1);
        options.tag = 100 + tag;
        comm.recv(got.data(), 4, DType::kF32, 0, options);
        EXPECT_EQ(got, (std::vector<float>{float(10 * tag), float(10 * tag + 1),
                                           float(10 * tag + 2), float(10 * tag + 3)}))
            << "tag " << options.tag;
      }
    }
  });
}

TEST(GlooCollectives, NativeIsRefusedBeforeAnythingIsSent) {
  run_gloo_ranks(2, [](Communicator& comm) {
    float x = 1;
    CollectiveOptions options;
    options.algorithm = Algorithm::kNative;
    EXPECT_THROW(comm.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum, options), ValueError);
    comm.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);  // the world is unharmed
    EXPECT_EQ(x, 2.0f);
  });
}

TEST(GlooGroups, SplitAndNewGroupReduceWithinTheirMembers) {
  run_gloo_ranks(4, [](Communicator& comm) {
    Communicator half = comm.split(comm.rank() % 2, -comm.rank());
    ASSERT_EQ(half.size(), 2);
    EXPECT_EQ(half.world_ranks().front(), comm.rank() % 2 == 0 ? 2 : 3);
    float x = float(comm.rank());
    half.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(x, comm.rank() % 2 == 0 ? 0 + 2 : 1 + 3);
    auto group = comm.new_group({3, 1, 2});
    if (comm.rank() == 0) {
      EXPECT_FALSE(group.has_value());
    } else {
      ASSERT_TRUE(group.has_value());
      std::vector<float> v(3, -1);
      v[size_t(group->rank())] = float(comm.rank());
      group->all_gather(v.data() + group->rank(), v.data(), 1, DType::kF32);
      EXPECT_EQ(v, (std::vector<float>{3, 1, 2}));
    }
    float y = 1;  // the world still works after both
    comm.all_reduce(&y, 1, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(y, 4);
  });
}

// A rank's compute thread and its gradient comm thread use the transport at the same time, on
// different groups and tags, with different sizes (recv_reduce stages per thread).
TEST(GlooTransportThreads, TwoThreadsOfARankShareTheTransport) {
  run_gloo_ranks(3, [](Communicator& world) {
    std::optional<Communicator> grads = world.new_group({0, 1, 2});
    ASSERT_TRUE(grads.has_value());
    const int r = world.rank();
    std::atomic<int> comm_thread_checks{0};
    std::exception_ptr comm_thread_error;
    std::jthread comm_thread([&] {
      try {
        CollectiveOptions options;
        options.tag = 1;
        options.timeout = 5000ms;
        options.algorithm = Algorithm::kRing;
        for (int i = 0; i < 30; ++i) {
          std::vector<float> v(size_t(4099 + i), float(r + i));
          grads->all_reduce(v.data(), int64_t(v.size()), DType::kF32, ReduceOp::kSum, options);
          if (v.front() == float(3 + 3 * i) && v.back() == float(3 + 3 * i)) ++comm_thread_checks;
        }
      } catch (...) {
        comm_thread_error = std::current_exception();
      }
    });
    CollectiveOptions options;
    options.tag = 2;
    options.timeout = 5000ms;
    options.algorithm = Algorithm::kHalvingDoubling;
    int checks = 0;
    for (int i = 0; i < 30; ++i) {
      std::vector<bf16> v(size_t(1001 + 7 * i), bf16(float(r * 2 + i % 5)));
      world.all_reduce(v.data(), int64_t(v.size()), DType::kBF16, ReduceOp::kMax, options);
      if (float(v.front()) == float(4 + i % 5) && float(v.back()) == float(4 + i % 5)) ++checks;
    }
    comm_thread.join();
    if (comm_thread_error) std::rethrow_exception(comm_thread_error);
    EXPECT_EQ(checks, 30);
    EXPECT_EQ(comm_thread_checks.load(), 30);
  });
}

// ---- failures end in errors, within bounded time ----

TEST(GlooTimeout, RecvWithoutSendTimesOutWithinTheDeadline) {
  std::latch done(1);
  run_gloo_ranks(2, [&](Communicator& comm) {
    if (comm.rank() == 1) {  // stays alive but never sends
      done.wait();
      return;
    }
    CountDownAtExit release{done};
    float x = 0;
    CollectiveOptions options;
    options.timeout = 300ms;
    options.tag = 7;
    const auto start = Clock::now();
    try {
      comm.recv(&x, 1, DType::kF32, 1, options);
      ADD_FAILURE() << "recv completed without a send";
    } catch (const TimeoutError& e) {
      EXPECT_GE(seconds_since(start), 0.29);
      EXPECT_LT(seconds_since(start), 5.0);
      EXPECT_TRUE(contains(e.what(), "recv (tag 7) on group 'world'")) << e.what();
      EXPECT_TRUE(contains(e.what(), "rank 1 did not send 4 bytes")) << e.what();
    }
  });
}

// Rank 2 skips the second all_reduce: every other rank fails, none later than a few seconds,
// and at least one with the collective's timeout error (the others may first see the closed
// connections of a rank that timed out).
TEST(GlooTimeout, RankSkippingACollectiveFailsEveryOtherRank) {
  std::latch done(2);
  std::mutex mutex;
  std::vector<std::string> timeouts, failures;
  run_gloo_ranks(3, [&](Communicator& comm) {
    std::vector<float> data(1000, 1.0f);
    CollectiveOptions options;
    options.timeout = 300ms;
    options.algorithm = Algorithm::kRing;
    comm.all_reduce(data.data(), 1000, DType::kF32, ReduceOp::kSum, options);  // seq 1
    EXPECT_EQ(data[999], 3.0f);
    if (comm.rank() == 2) {
      done.wait();
      return;
    }
    CountDownAtExit release{done};
    const auto start = Clock::now();
    try {
      comm.all_reduce(data.data(), 1000, DType::kF32, ReduceOp::kSum, options);
      ADD_FAILURE() << "rank " << comm.rank() << " completed an all_reduce rank 2 skipped";
    } catch (const TimeoutError& e) {
      std::lock_guard lock(mutex);
      timeouts.push_back(e.what());
    } catch (const CommError& e) {
      std::lock_guard lock(mutex);
      failures.push_back(e.what());
    }
    EXPECT_LT(seconds_since(start), 5.0);
  });
  ASSERT_EQ(timeouts.size() + failures.size(), 2u);
  ASSERT_GE(timeouts.size(), 1u);
  for (const std::string& e : timeouts) {
    EXPECT_TRUE(contains(e, "all_reduce on group 'world' (sequence number 2")) << e;
    EXPECT_TRUE(contains(e, "timed out after 300 ms")) << e;
  }
  for (const std::string& e : failures) EXPECT_TRUE(contains(e, "gloo transport")) << e;
}

// A count mismatch cannot reach Gloo (which would abort the process on an oversized message):
// the byte count is part of the slot, so the two sides never match and both time out.
TEST(GlooTimeout, CountMismatchTimesOutInsteadOfCrashing) {
  std::string receiver_error;
  std::atomic<int> failed{0};
  run_gloo_ranks(2, [&](Communicator& comm) {
    std::vector<float> v(8, 1.0f);
    CollectiveOptions options;
    options.timeout = 300ms;
    try {
      if (comm.rank() == 0) {
        comm.send(v.data(), 8, DType::kF32, 1, options);
      } else {
        comm.recv(v.data(), 4, DType::kF32, 0, options);
      }
      ADD_FAILURE() << "rank " << comm.rank() << " matched 32 bytes with 16";
    } catch (const TimeoutError& e) {
      ++failed;
      if (comm.rank() == 1) receiver_error = e.what();
    } catch (const CommError&) {
      ++failed;  // the other side's timeout closed the connection first
    }
  });
  EXPECT_EQ(failed.load(), 2);
  EXPECT_TRUE(receiver_error.empty() || contains(receiver_error, "a send of another size"))
      << receiver_error;
}

TEST(GlooFailure, DeadPeerFailsARecvAtOnce) {
  run_gloo_ranks(2, [](Communicator& comm) {
    float x = float(comm.rank());
    comm.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(x, 1.0f);
    if (comm.rank() == 1) return;  // its transport is destroyed: the process died
    CollectiveOptions options;
    options.timeout = 10000ms;
    const auto start = Clock::now();
    try {
      comm.recv(&x, 1, DType::kF32, 1, options);
      ADD_FAILURE() << "recv from a dead rank completed";
    } catch (const CommError& e) {
      EXPECT_LT(seconds_since(start), 5.0) << "reported at the deadline, not when the peer died";
      EXPECT_TRUE(contains(e.what(), "the connection to rank 1 failed")) << e.what();
    }
  });
}

TEST(GlooFailure, DeadPeerFailsASendAtOnce) {
  run_gloo_ranks(2, [](Communicator& comm) {
    comm.barrier();
    if (comm.rank() == 1) return;
    std::vector<float> big(1 << 20, 1.0f);  // more than the socket buffers hold
    CollectiveOptions options;
    options.timeout = 10000ms;
    const auto start = Clock::now();
    try {
      comm.send(big.data(), int64_t(big.size()), DType::kF32, 1, options);
      ADD_FAILURE() << "send to a dead rank completed";
    } catch (const CommError& e) {
      EXPECT_LT(seconds_since(start), 5.0);
      EXPECT_TRUE(contains(e.what(), "rank 1")) << e.what();
    }
  });
}

// A send dropped before its wait (an exception unwinding a collective) closes the transport:
// Gloo could otherwise read the sender's freed buffer. The sender's next call fails at once;
// the peer's recv fails at once too, unless the bytes had already crossed before the close (a
// small send can be on the wire the moment it is posted): then they arrive whole, and the
// peer's next call fails.
TEST(GlooFailure, DroppedSendClosesTheTransport) {
  std::latch dropped(1);
  // Both transports connected before rank 0 closes its own: one side's create can return while
  // the other's is still finishing its handshake, which a close would fail (a flake seen in a
  // full run: "rank 1 of 2 could not connect … Connection closed by peer").
  std::latch connected(2);
  run_gloo_transports(2, [&](std::shared_ptr<GlooTransport> transport) {
    connected.arrive_and_wait();
    const MessageKey key{1, 2};
    std::vector<float> data(256, 1.0f);
    const Deadline deadline = CommClock::now() + 10s;
    const auto start = Clock::now();
    if (transport->world_rank() == 0) {
      CountDownAtExit release{dropped};
      transport->post_send(1, key, data.data(), data.size() * 4).reset();
      data.clear();
      data.shrink_to_fit();  // freed: Gloo must not read it any more
      try {
        transport->recv(1, key, nullptr, 0, deadline);
        ADD_FAILURE() << "a closed transport received";
      } catch (const CommError& e) {
        EXPECT_TRUE(contains(e.what(), "abandoned")) << e.what();
      }
    } else {
      dropped.wait();
      std::vector<float> received(data.size(), 0.0f);
      try {
        transport->recv(0, key, received.data(), received.size() * 4, deadline);
        EXPECT_EQ(received, data) << "a dropped send arrived torn";
        transport->recv(0, key, received.data(), received.size() * 4, deadline);
        ADD_FAILURE() << "a closed peer's transport kept receiving";
      } catch (const CommError& e) {
        EXPECT_TRUE(contains(e.what(), "rank 0")) << e.what();
      }
    }
    EXPECT_LT(seconds_since(start), 5.0);
  });
}

// ---- rendezvous ----

TEST(GlooRendezvous, MissingRankFailsCreateWithinTheTimeoutNamingIt) {
  gloo::rendezvous::HashStore store;
  std::mutex mutex;
  std::vector<std::string> errors;
  auto rank_main = [&](int rank) {
    GlooOptions options;
    options.rank = rank;
    options.size = 3;  // rank 2 never comes
    options.prefix = "gen0/";
    options.timeout = 300ms;
    const auto start = Clock::now();
    try {
      GlooTransport::create(store, options);
      ADD_FAILURE() << "rank " << rank << " connected to a world missing rank 2";
    } catch (const CommError& e) {
      std::lock_guard lock(mutex);
      errors.push_back(e.what());
    }
    EXPECT_GE(seconds_since(start), 0.29);
    EXPECT_LT(seconds_since(start), 5.0);
  };
  {
    std::jthread other(rank_main, 1);
    rank_main(0);
  }
  ASSERT_EQ(errors.size(), 2u);
  for (const std::string& e : errors) {
    EXPECT_TRUE(contains(e, "ranks [2] never arrived")) << e;
    EXPECT_TRUE(contains(e, "prefix 'gen0/'")) << e;
    EXPECT_TRUE(contains(e, "300 ms")) << e;
  }
}

// An elastic rank whose generation the agent replaced before every rank arrived gives up its
// rendezvous at once instead of waiting out the deadline for a rank that will never come.
TEST(GlooRendezvous, AnAbandonedRendezvousEndsBeforeItsDeadline) {
  gloo::rendezvous::HashStore store;
  GlooOptions options;
  options.rank = 0;
  options.size = 2;  // rank 1 never comes
  options.prefix = "gen3/";
  options.timeout = 20s;
  const auto start = Clock::now();
  options.abandon = [&] { return seconds_since(start) > 0.1; };
  try {
    GlooTransport::create(store, options);
    ADD_FAILURE() << "rank 0 connected to a world missing rank 1";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.what(), "abandoned")) << e.what();
  }
  EXPECT_GE(seconds_since(start), 0.1);
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(GlooRendezvous, RanksDisagreeingOnTheWorldSizeAreRefused) {
  gloo::rendezvous::HashStore store;
  std::string error;
  std::jthread other([&] {
    GlooOptions options;
    options.rank = 1;
    options.size = 3;
    options.timeout = 300ms;
    EXPECT_THROW(GlooTransport::create(store, options), CommError);  // waits for rank 2
  });
  GlooOptions options;
  options.rank = 0;
  options.size = 2;
  options.timeout = 300ms;
  try {
    GlooTransport::create(store, options);
    ADD_FAILURE() << "connected to a rank of another world size";
  } catch (const ConfigError& e) {
    error = e.what();
  }
  EXPECT_TRUE(contains(error, "rank 1 joined a world of 3 ranks, but rank 0 expects 2")) << error;
}

// Every connection of a job proves it holds the job's secret before create() returns: ranks
// with the same secret connect and reduce; a rank with another secret is refused by its peer,
// named, and nothing of the job's data is exchanged with it.
TEST(GlooSecret, RanksWithTheJobsSecretConnectAndAStrangerIsRefused) {
  for (const bool stranger : {false, true}) {
    gloo::rendezvous::HashStore store;
    std::vector<std::string> errors(2);
    auto rank_main = [&](int rank) {
      GlooOptions options;
      options.rank = rank;
      options.size = 2;
      options.timeout = 5000ms;
      options.secret = rank == 1 && stranger ? "another-secret-of-32-characters-x"
                                             : "the-jobs-secret-of-32-characters-y";
      try {
        Communicator world(GlooTransport::create(store, options));
        float x = 1.0f;
        world.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
        EXPECT_EQ(x, 2.0f);
      } catch (const CommError& e) {
        errors[size_t(rank)] = e.what();
      }
    };
    std::jthread other(rank_main, 1);
    rank_main(0);
    other.join();
    if (!stranger) {
      EXPECT_EQ(errors[0], "");
      EXPECT_EQ(errors[1], "");
      continue;
    }
    // Each side finds the other's answer wrong, or its connection closed by the other's refusal
    // when that came first (which one does depends on the scheduler): at least one names it.
    const auto refused = [](const std::string& error, int peer) {
      return contains(error, fmt::format("the connection that claims to be rank {} did not prove "
                                         "it holds the job's secret: refused",
                                         peer));
    };
    EXPECT_TRUE(refused(errors[0], 1) || refused(errors[1], 0)) << errors[0] << "\n" << errors[1];
    EXPECT_FALSE(errors[0].empty());
    EXPECT_FALSE(errors[1].empty());
  }
}

// The launcher's store: a FileStore directory, one key prefix per generation. A restarted world
// (the next generation) meets in the same directory without meeting the old keys; reusing a
// generation is refused instead of connecting to addresses of processes that are gone.
TEST(GlooRendezvous, FileStoreGenerations) {
  const auto dir = testing::scratch_dir("gloo_file_store");
  auto run_generation = [&](int generation) {
    std::vector<float> sums(2, 0.0f);
    auto rank_main = [&](int rank) {
      GlooOptions options;
      options.rank = rank;
      options.size = 2;
      options.store_path = dir.string();
      options.prefix = "gen" + std::to_string(generation) + "/";
      options.timeout = 5000ms;
      Communicator world(GlooTransport::create(options));
      float x = float(rank + 1 + generation);
      world.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
      sums[size_t(rank)] = x;
    };
    {
      std::jthread other(rank_main, 1);
      rank_main(0);
    }
    return sums;
  };
  EXPECT_EQ(run_generation(0), (std::vector<float>{3, 3}));
  EXPECT_EQ(run_generation(1), (std::vector<float>{5, 5}));
  GlooOptions reused;
  reused.size = 2;
  reused.store_path = dir.string();
  reused.prefix = "gen1/";
  reused.timeout = 300ms;
  try {
    GlooTransport::create(reused);
    ADD_FAILURE() << "joined a generation that already ran";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "rank 0 has already arrived")) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(GlooRendezvous, StoreThatIsNotADirectoryIsAConfigError) {
  GlooOptions options;
  options.store_path = "/nonexistent/lattice-store";
  try {
    GlooTransport::create(options);
    ADD_FAILURE() << "created a transport on a missing store";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "'/nonexistent/lattice-store' is not a directory")) << e.what();
  }
}

TEST(GlooRendezvous, UnusableBindAddressIsAConfigError) {
  gloo::rendezvous::HashStore store;
  GlooOptions options;
  options.hostname = "192.0.2.1";  // TEST-NET-1: never an address of this host
  try {
    GlooTransport::create(store, options);
    ADD_FAILURE() << "bound a TCP device to a foreign address";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot bind a TCP device to '192.0.2.1'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "LATTICE_BIND_ADDR")) << e.what();
  }
}

TEST(GlooRendezvous, OneRankWorld) {
  run_gloo_ranks(1, [](Communicator& comm) {
    EXPECT_EQ(comm.size(), 1);
    float x = 5;
    comm.all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
    comm.barrier();
    EXPECT_EQ(x, 5.0f);
  });
}

TEST(GlooSlots, DistinctForDistinctKeysAndSizesAndDeterministic) {
  std::set<uint64_t> seen;
  int keys = 0;
  for (uint64_t context : {uint64_t(0x4c41545449434531ull), uint64_t(1), uint64_t(2)}) {
    for (uint64_t tag = 0; tag < 200; ++tag) {
      for (size_t bytes : {size_t(0), size_t(4), size_t(8), size_t(1) << 20}) {
        const uint64_t collective_tag = (uint64_t(1) << 63) | (tag << 16);
        seen.insert(GlooTransport::slot({context, tag}, bytes));
        seen.insert(GlooTransport::slot({context, collective_tag}, bytes));
        keys += 2;
      }
    }
  }
  EXPECT_EQ(seen.size(), size_t(keys));
  EXPECT_EQ(GlooTransport::slot({7, 9}, 16), GlooTransport::slot({7, 9}, 16));
}

}  // namespace
}  // namespace lattice
