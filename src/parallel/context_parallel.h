// Context parallelism (docs/context-parallel.md): every sequence of a micro-batch split over the
// ranks of a cp group, attention as a ring (Liu et al. 2023, "Ring Attention").
//
// Causal balance (Megatron-LM, Llama 3): the T positions are cut into 2·cp equal chunks and rank
// r holds chunks r and 2·cp − 1 − r, so each rank has as many early (cheap) as late (costly)
// queries. Its local sequence is the two chunks back to back, T / cp positions; everything but
// attention is position-wise and runs on them unchanged, with the chunks' global positions for
// RoPE and learned positions.
//
// Ring attention: each rank keeps its queries; the keys and values of both its chunks (one
// buffer) go round the ring, cp − 1 hops. At each hop the block in hand is sent on to rank r + 1
// while its tiles are computed (the transfer overlaps the compute), each query chunk against each
// key chunk at or before it: the diagonal causal, earlier chunks whole, later ones skipped. The
// partial results are merged by log-sum-exp (the flash running max and sum carried across
// blocks). The backward sends the blocks round again; each rank computes its share of the block
// in hand's key/value gradients while the sum of the earlier ranks' shares arrives, adds it and
// sends the sum on, so that it reaches the block's owner after one more hop and only the last
// hop's transfer is not hidden behind products. The order of every sum is fixed, so the same
// layout twice is bitwise identical.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "core/tensor.h"

namespace lattice {

// What a rank's ring moved and waited for since the last reset_stats().
struct ContextParallelStats {
  int64_t hops = 0;            // blocks sent on (forward and backward)
  int64_t bytes = 0;           // sent by this rank
  double exposed_seconds = 0;  // blocked in receives and send waits: traffic compute did not hide
  double seconds = 0;          // inside ring attention, compute included
};

// One hop of the ring, for `lattice explain` and tests.
struct RingRecord {
  std::string what;  // "layer 0 attention (fwd) hop 1"
  int send_to = 0, recv_from = 0;
  int64_t elements = 0;  // sent
  DType dtype = DType::kF32;
};

// ConfigError naming the numbers and the fix unless seq_len splits into 2·cp equal chunks.
void validate_context_parallel(int cp, int64_t seq_len);

// One block product of the ring: this rank's local query chunk (0 or 1) against the key/value
// chunk (0 or 1) of the block in hand; the global chunk ids (of 2·cp) they are.
struct RingPair {
  int query_chunk = 0, key_chunk = 0;
  int query_id = 0, key_id = 0;
  bool causal = false;  // the diagonal (same chunk); otherwise every key is before every query
};

// What rank `rank` of `cp` does at each hop of a layer's ring: the block it holds (from `source`,
// its own at hop 0) and the products with it; chunk pairs entirely in the future are skipped.
// The forward and the backward walk the same hops; `lattice explain` prints them.
struct RingHop {
  int hop = 0;
  int source = 0;
  std::vector<RingPair> pairs;
};
std::vector<RingHop> ring_schedule(int cp, int rank);

class ContextParallel {
 public:
  ContextParallel() = default;  // no group: one rank holds whole sequences
  explicit ContextParallel(Communicator* group);

  int size() const { return group_ == nullptr ? 1 : group_->size(); }
  int rank() const { return group_ == nullptr ? 0 : group_->rank(); }
  Communicator* group() const { return group_; }

  // Global position of local position t of a local sequence of local_T = T / cp positions.
  int64_t global_position(int64_t t, int64_t local_T) const;
  // How many local positions from t on are consecutive globally (to the end of t's chunk).
  int64_t consecutive_positions(int64_t t, int64_t local_T) const;
  // local (B, T / cp) = this rank's two chunks of every row of full (B, T) (i32 tokens).
  void take_local_positions(Tensor& local, const Tensor& full) const;

  // q (B, t, NH, HS), k and v (B, t, NKV, HS) this rank's local sequences (t = T / cp);
  // out (B, t, NH, HS) in q's dtype, lse (B, NH, t) f32: the causal attention over the whole
  // sequences. Collective over the group; temporaries from `arena`.
  void attention_forward(Arena& arena, Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                         const Tensor& v, std::string_view what);
  // dq, dk, dv += the gradients of this rank's positions. Collective.
  void attention_backward(Arena& arena, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                          const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, std::string_view what);

  void set_logging(bool on) { logging_ = on; }
  const std::vector<RingRecord>& log() const { return log_; }
  const ContextParallelStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  struct Hop;
  Hop start_hop(const Tensor& block, std::string_view what, int hop);
  // From the previous rank (blocked time counted as exposed), and the wait for a send's peer.
  void receive(Tensor& received);
  void wait(Hop& hop);
  void finish_hop(Hop& hop, Tensor& received);  // receive, then wait

  Communicator* group_ = nullptr;
  bool logging_ = false;
  std::vector<RingRecord> log_;
  ContextParallelStats stats_;
};

}  // namespace lattice
