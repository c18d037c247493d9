// Binomial trees rooted at virtual rank 0 (MPICH's short-message algorithms): rank v's parent is
// v with its lowest set bit cleared, its children v + m for powers of two m below that bit, so
// depth is ceil(log2 n) and the subtree under v at level m is the contiguous ranks [v, v + m).
#include <algorithm>
#include <bit>

#include "comm/algorithms.h"

namespace lattice {
namespace {

// The level at which v receives from its parent (its lowest set bit); for the root, the first
// power of two >= n.
int parent_mask(int v, int n) {
  return v == 0 ? int(std::bit_ceil(unsigned(n))) : (v & -v);
}

}  // namespace

void tree_reduce(Exchange& ex, void* buf, int64_t count) {
  const int n = ex.size(), v = ex.vrank();
  for (int mask = 1; mask < n; mask *= 2) {
    const int step = std::countr_zero(unsigned(mask));
    if (v & mask) {
      ex.send(v - mask, step, buf, 0, count)->wait(ex.deadline());
      return;
    }
    if (v + mask < n) ex.recv_reduce(v + mask, step, buf, 0, count);
  }
}

void tree_broadcast(Exchange& ex, void* buf, int64_t count) {
  const int n = ex.size(), v = ex.vrank();
  const int top = parent_mask(v, n);
  if (v != 0) ex.recv(v - top, std::countr_zero(unsigned(top)), buf, 0, count);
  std::vector<PendingSendPtr> sends;
  for (int mask = top / 2; mask >= 1; mask /= 2) {
    if (v + mask < n) {
      sends.push_back(ex.send(v + mask, std::countr_zero(unsigned(mask)), buf, 0, count));
    }
  }
  for (auto& s : sends) s->wait(ex.deadline());
}

void tree_gather(Exchange& ex, void* buf, const Blocks& blocks) {
  const int n = ex.size(), v = ex.vrank();
  for (int mask = 1; mask < n; mask *= 2) {
    const int step = std::countr_zero(unsigned(mask));
    if (v & mask) {
      ex.send(v - mask, step, buf, blocks.start(v), blocks.start(std::min(v + mask, n)))
          ->wait(ex.deadline());
      return;
    }
    if (v + mask < n) {
      ex.recv(v + mask, step, buf, blocks.start(v + mask), blocks.start(std::min(v + 2 * mask, n)));
    }
  }
}

void tree_scatter(Exchange& ex, void* buf, const Blocks& blocks) {
  const int n = ex.size(), v = ex.vrank();
  const int top = parent_mask(v, n);
  if (v != 0) {
    ex.recv(v - top, std::countr_zero(unsigned(top)), buf, blocks.start(v),
            blocks.start(std::min(v + top, n)));
  }
  std::vector<PendingSendPtr> sends;
  for (int mask = top / 2; mask >= 1; mask /= 2) {
    if (v + mask < n) {
      sends.push_back(ex.send(v + mask, std::countr_zero(unsigned(mask)), buf,
                              blocks.start(v + mask), blocks.start(std::min(v + 2 * mask, n))));
    }
  }
  for (auto& s : sends) s->wait(ex.deadline());
}

}  // namespace lattice
