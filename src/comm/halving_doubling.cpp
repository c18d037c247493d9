// Recursive halving (reduce-scatter) and recursive doubling (all-gather), after Rabenseifner
// (2004) and Thakur, Rabenseifner & Gropp (2005): log2(n) steps each, bandwidth-optimal for
// powers of two.
//
// Non-power-of-two fix-up (MPICH): with p the largest power of two <= n and rem = n - p, the
// first 2*rem ranks pair up; each even one hands its data to its odd neighbour and sits out,
// the odd one continues as new rank v/2, the others as v - rem. New rank i then stands for the
// blocks of real ranks [first_block(i), first_block(i + 1)), a contiguous range, so every
// message below is a single range of elements.
#include <bit>

#include "comm/algorithms.h"

namespace lattice {
namespace {

struct FixUp {
  int n, p, rem;
  explicit FixUp(int n_) : n(n_), p(int(std::bit_floor(unsigned(n_)))), rem(n_ - p) {}
  bool sits_out(int v) const { return v < 2 * rem && v % 2 == 0; }
  int new_rank(int v) const { return v < 2 * rem ? v / 2 : v - rem; }
  int real_rank(int i) const { return i < rem ? 2 * i + 1 : i + rem; }
  int first_block(int i) const { return i < rem ? 2 * i : i + rem; }  // i in [0, p]
};

// Elements covered by new ranks [lo, hi).
int64_t range_start(const FixUp& f, const Blocks& b, int lo) {
  return b.start(f.first_block(lo));
}

}  // namespace

void hd_reduce_scatter(Exchange& ex, void* buf, const Blocks& blocks) {
  const FixUp f(ex.size());
  const int v = ex.vrank();
  const int64_t total = blocks.total();
  int step = 0;
  if (v < 2 * f.rem) {  // fold the extra ranks into their partners
    if (f.sits_out(v)) {
      ex.send(v + 1, step, buf, 0, total)->wait(ex.deadline());
    } else {
      ex.recv_reduce(v - 1, step, buf, 0, total);
    }
  }
  ++step;
  if (!f.sits_out(v)) {
    const int i = f.new_rank(v);
    int lo = 0, hi = f.p;  // new ranks whose elements this rank still reduces
    for (int mask = f.p / 2; mask >= 1; mask /= 2, ++step) {
      const int partner = i ^ mask, mid = lo + (hi - lo) / 2;
      const bool keep_low = (i & mask) == 0;
      const int keep_lo = keep_low ? lo : mid, keep_hi = keep_low ? mid : hi;
      const int give_lo = keep_low ? mid : lo, give_hi = keep_low ? hi : mid;
      auto sent = ex.send(f.real_rank(partner), step, buf, range_start(f, blocks, give_lo),
                          range_start(f, blocks, give_hi));
      ex.recv_reduce(f.real_rank(partner), step, buf, range_start(f, blocks, keep_lo),
                     range_start(f, blocks, keep_hi));
      sent->wait(ex.deadline());
      lo = keep_lo;
      hi = keep_hi;
    }
  }
  // The odd partner of a rank that sat out holds its block too: hand it back.
  step = 1 + std::countr_zero(unsigned(f.p));
  if (v < 2 * f.rem) {
    if (f.sits_out(v)) {
      ex.recv(v + 1, step, buf, blocks.start(v), blocks.end(v));
    } else {
      ex.send(v - 1, step, buf, blocks.start(v - 1), blocks.end(v - 1))->wait(ex.deadline());
    }
  }
}

void hd_all_gather(Exchange& ex, void* buf, const Blocks& blocks) {
  const FixUp f(ex.size());
  const int v = ex.vrank();
  int step = 0;
  if (v < 2 * f.rem) {  // the extra ranks hand their block to their partners
    if (f.sits_out(v)) {
      ex.send(v + 1, step, buf, blocks.start(v), blocks.end(v))->wait(ex.deadline());
    } else {
      ex.recv(v - 1, step, buf, blocks.start(v - 1), blocks.end(v - 1));
    }
  }
  ++step;
  if (!f.sits_out(v)) {
    const int i = f.new_rank(v);
    for (int mask = 1; mask < f.p; mask *= 2, ++step) {
      const int partner = i ^ mask;
      const int mine = i & ~(mask - 1), theirs = partner & ~(mask - 1);
      auto sent = ex.send(f.real_rank(partner), step, buf, range_start(f, blocks, mine),
                          range_start(f, blocks, mine + mask));
      ex.recv(f.real_rank(partner), step, buf, range_start(f, blocks, theirs),
              range_start(f, blocks, theirs + mask));
      sent->wait(ex.deadline());
    }
  }
  step = 1 + std::countr_zero(unsigned(f.p));
  if (v < 2 * f.rem) {  // and get the whole vector back
    if (f.sits_out(v)) {
      ex.recv(v + 1, step, buf, 0, blocks.total());
    } else {
      ex.send(v - 1, step, buf, 0, blocks.total())->wait(ex.deadline());
    }
  }
}

}  // namespace lattice
