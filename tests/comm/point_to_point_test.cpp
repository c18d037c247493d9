// Tagged send/recv: a recv matches the send from its peer with the same tag, in order.
#include <gtest/gtest.h>

#include "comm/thread_world.h"

namespace lattice {
namespace {

TEST(CommPointToPoint, TaggedMessagesArriveInOrder) {
  run_ranks(3, [](Communicator& comm) {
    // A ring of messages: each rank sends to the next, tag = message number.
    const int next = (comm.rank() + 1) % 3, prev = (comm.rank() + 2) % 3;
    for (uint32_t tag = 0; tag < 4; ++tag) {
      CollectiveOptions options;
      options.tag = tag;
      std::vector<float> out(5, float(comm.rank() * 10 + int(tag))), in(5, -1);
      if (comm.rank() == 0) {  // rank 0 sends first, so the ring cannot deadlock
        comm.send(out.data(), 5, DType::kF32, next, options);
        comm.recv(in.data(), 5, DType::kF32, prev, options);
      } else {
        comm.recv(in.data(), 5, DType::kF32, prev, options);
        comm.send(out.data(), 5, DType::kF32, next, options);
      }
      for (float v : in) EXPECT_EQ(v, float(prev * 10 + int(tag)));
    }
  });
}

TEST(CommPointToPoint, CountMismatchIsReported) {
  EXPECT_THROW(run_ranks(2,
                         [](Communicator& comm) {
                           std::vector<float> v(8);
                           if (comm.rank() == 0) {
                             comm.send(v.data(), 8, DType::kF32, 1);
                           } else {
                             comm.recv(v.data(), 4, DType::kF32, 0);
                           }
                         }),
               CommError);
}

}  // namespace
}  // namespace lattice
