// Ring algorithms (Patarasuk & Yuan 2009): bandwidth-optimal, 2(n-1) latency steps for
// all_reduce. Rank v sends to v+1 and receives from v-1; the send is posted before the receive
// so neighbours never wait on each other's rendezvous.
#include <algorithm>

#include "comm/algorithms.h"

namespace lattice {
namespace {

int wrap(int v, int n) {
  return ((v % n) + n) % n;
}

}  // namespace

void ring_reduce_scatter(Exchange& ex, void* buf, const Blocks& blocks) {
  const int n = ex.size(), v = ex.vrank();
  // At step s rank v passes on block v-s-1 (its own contribution at s = 0, the partial sum it
  // received at s-1 after that) and folds block v-s-2 from its left neighbour; after n-1 steps
  // block v has passed through every rank and ends on rank v.
  for (int s = 0; s < n - 1; ++s) {
    int out = wrap(v - s - 1, n), in = wrap(v - s - 2, n);
    auto sent = ex.send(wrap(v + 1, n), s, buf, blocks.start(out), blocks.end(out));
    ex.recv_reduce(wrap(v - 1, n), s, buf, blocks.start(in), blocks.end(in));
    sent->wait(ex.deadline());
  }
}

void ring_all_gather(Exchange& ex, void* buf, const Blocks& blocks) {
  const int n = ex.size(), v = ex.vrank();
  for (int s = 0; s < n - 1; ++s) {
    int out = wrap(v - s, n), in = wrap(v - s - 1, n);
    auto sent = ex.send(wrap(v + 1, n), s, buf, blocks.start(out), blocks.end(out));
    ex.recv(wrap(v - 1, n), s, buf, blocks.start(in), blocks.end(in));
    sent->wait(ex.deadline());
  }
}

void ring_broadcast(Exchange& ex, void* buf, int64_t count) {
  const int n = ex.size(), v = ex.vrank();
  if (n == 1) return;
  // Pipelining pays once the chain is longer than one hop; 512 KiB segments keep a segment in
  // cache while the next hop reads it. At most 64 segments keep the step count in the tag.
  constexpr int64_t kSegmentBytes = int64_t(512) << 10;
  int64_t bytes = count * int64_t(ex.element_size());
  int segments = n > 2 ? int(std::clamp<int64_t>(bytes / kSegmentBytes, 1, 64)) : 1;
  Blocks seg = Blocks::balanced(segments, count);
  PendingSendPtr previous;
  for (int s = 0; s < segments; ++s) {
    if (v > 0) ex.recv(v - 1, s, buf, seg.start(s), seg.end(s));
    if (v < n - 1) {
      auto sent = ex.send(v + 1, s, buf, seg.start(s), seg.end(s));
      if (previous) previous->wait(ex.deadline());
      previous = std::move(sent);
    }
  }
  if (previous) previous->wait(ex.deadline());
}

}  // namespace lattice
