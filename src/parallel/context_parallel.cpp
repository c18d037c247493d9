#include "parallel/context_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/timer.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"

namespace lattice {

namespace {

constexpr MemoryCategory kWorkspace = MemoryCategory::kWorkspace;

// dst positions [dst_t0, dst_t0 + count) (=, or += when accumulate) src positions [src_t0, ...)
// of every sequence, both (B, T', H, HS) with their own T' and float dtypes.
void copy_positions(const Tensor& dst, int64_t dst_t0, const Tensor& src, int64_t src_t0,
                    int64_t count, bool accumulate = false) {
  const int64_t B = dst.dim(0), row = dst.dim(2) * dst.dim(3);
  const int64_t dst_T = dst.dim(1), src_T = src.dim(1);
  const size_t dst_size = dtype_size(dst.dtype()), src_size = dtype_size(src.dtype());
  auto* out = static_cast<std::byte*>(dst.raw_data());
  const auto* in = static_cast<const std::byte*>(src.raw_data());
  std::vector<float> staging;
  for (int64_t b = 0; b < B; ++b) {
    std::byte* d = out + size_t((b * dst_T + dst_t0) * row) * dst_size;
    const std::byte* s = in + size_t((b * src_T + src_t0) * row) * src_size;
    const int64_t n = count * row;
    if (!accumulate) {
      convert(s, src.dtype(), d, dst.dtype(), n);
      continue;
    }
    staging.resize(size_t(2 * n));
    convert(s, src.dtype(), staging.data(), DType::kF32, n);
    convert(d, dst.dtype(), staging.data() + n, DType::kF32, n);
    for (int64_t i = 0; i < n; ++i) staging[size_t(n + i)] += staging[size_t(i)];
    convert(staging.data() + n, DType::kF32, d, dst.dtype(), n);
  }
}

// The keys and values of both local chunks in one buffer, chunk-contiguous, so that a block
// travels as one message and each chunk is a kernel operand as it arrives:
// [k chunk 0 | k chunk 1 | v chunk 0 | v chunk 1], each (B, c, NKV, HS).
struct KvBlock {
  Tensor data;  // (4, B·c·NKV·HS)
  Shape chunk;  // (B, c, NKV, HS)
  Tensor part(int index) const { return data.slice_rows(index, index + 1).view(chunk); }
  Tensor k(int chunk_index) const { return part(chunk_index); }
  Tensor v(int chunk_index) const { return part(2 + chunk_index); }
};

// Blocks in flight are communication buffers in the arena's accounting; the ring's other
// temporaries (chunk copies, partial results) are workspace: activations stay what the model keeps.
KvBlock kv_block(Arena& arena, Shape chunk, DType dtype, bool zeroed) {
  const int64_t elements = chunk.numel();
  constexpr MemoryCategory kInFlight = MemoryCategory::kCommunication;
  Tensor data = zeroed ? Tensor::zeros(arena, {4, elements}, dtype, kInFlight)
                       : Tensor::empty(arena, {4, elements}, dtype, kInFlight);
  return {std::move(data), std::move(chunk)};
}

Tensor chunk_of(Arena& arena, const Tensor& t, int64_t t0, int64_t c, DType dtype) {
  Tensor out =
      Tensor::empty(arena, {t.dim(0), c, t.dim(2), t.dim(3)}, dtype, MemoryCategory::kWorkspace);
  copy_positions(out, 0, t, t0, c);
  return out;
}

// Rows (b, h) of a (B, NH, T) lse: positions [t0, t0 + count) of `full` to or from `part`.
void copy_lse(const Tensor& full, int64_t t0, const Tensor& part, bool into_part) {
  const int64_t rows = full.dim(0) * full.dim(1), T = full.dim(2), c = part.dim(2);
  float* f = full.data<float>();
  float* p = part.data<float>();
  for (int64_t row = 0; row < rows; ++row) {
    float* a = f + row * T + t0;
    float* b = p + row * c;
    if (into_part) {
      std::copy(a, a + c, b);
    } else {
      std::copy(b, b + c, a);
    }
  }
}

}  // namespace

void validate_context_parallel(int cp, int64_t seq_len) {
  if (cp < 1) {
    LATTICE_THROW(ConfigError, "--cp {}: a context-parallel group has at least one rank", cp);
  }
  if (cp > 1 && seq_len % (2 * cp) != 0) {
    LATTICE_THROW(ConfigError,
                  "context parallelism cuts each sequence of seq_len {} into 2·cp = {} equal "
                  "chunks (two per rank, for causal balance), which do not divide it ---> HINT: "
                  "choose a sequence length that is a multiple of {}, or another --cp",
                  seq_len, 2 * cp, 2 * cp);
  }
}

std::vector<RingHop> ring_schedule(int cp, int rank) {
  std::vector<RingHop> hops;
  const int query_ids[2] = {rank, 2 * cp - 1 - rank};
  for (int hop = 0; hop < cp; ++hop) {
    RingHop h{.hop = hop, .source = (rank - hop + cp) % cp, .pairs = {}};
    const int key_ids[2] = {h.source, 2 * cp - 1 - h.source};
    for (int j = 0; j < 2; ++j) {
      for (int i = 0; i < 2; ++i) {
        if (key_ids[i] > query_ids[j]) continue;  // keys after every query of the chunk
        h.pairs.push_back({.query_chunk = j,
                           .key_chunk = i,
                           .query_id = query_ids[j],
                           .key_id = key_ids[i],
                           .causal = key_ids[i] == query_ids[j]});
      }
    }
    hops.push_back(std::move(h));
  }
  return hops;
}

ContextParallel::ContextParallel(Communicator* group) : group_(group) {}

int64_t ContextParallel::global_position(int64_t t, int64_t local_T) const {
  if (size() == 1) return t;
  const int64_t c = local_T / 2;
  const int64_t chunk = t < c ? rank() : 2 * size() - 1 - rank();
  return chunk * c + t % c;
}

int64_t ContextParallel::consecutive_positions(int64_t t, int64_t local_T) const {
  if (size() == 1) return local_T - t;
  const int64_t c = local_T / 2;
  return c - t % c;
}

void ContextParallel::take_local_positions(Tensor& local, const Tensor& full) const {
  expect_dtype(local, DType::kI32, "ContextParallel::take_local_positions", "local");
  expect_dtype(full, DType::kI32, "ContextParallel::take_local_positions", "full");
  const int64_t B = full.dim(0), T = full.dim(1), local_T = T / size(), c = local_T / 2;
  expect_shape(local, {B, local_T}, "ContextParallel::take_local_positions", "local");
  const int32_t* in = full.data<int32_t>();
  int32_t* out = local.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t first = global_position(j * c, local_T);
      std::copy(in + b * T + first, in + b * T + first + c, out + b * local_T + j * c);
    }
  }
}

struct ContextParallel::Hop {
  Communicator::SendHandle send;
};

ContextParallel::Hop ContextParallel::start_hop(const Tensor& block, std::string_view what,
                                                int hop) {
  const int n = size(), r = rank();
  Hop h;
  h.send = group_->send_async(block, (r + 1) % n);
  ++stats_.hops;
  stats_.bytes += int64_t(block.nbytes());
  if (logging_) {
    log_.push_back({.what = fmt::format("{} hop {}", what, hop),
                    .send_to = (r + 1) % n,
                    .recv_from = (r + n - 1) % n,
                    .elements = block.numel(),
                    .dtype = block.dtype()});
  }
  return h;
}

void ContextParallel::receive(Tensor& received) {
  Stopwatch blocked;
  group_->recv(received, (rank() + size() - 1) % size());
  stats_.exposed_seconds += blocked.seconds();
}

void ContextParallel::wait(Hop& hop) {
  Stopwatch blocked;
  hop.send.wait();
  stats_.exposed_seconds += blocked.seconds();
}

void ContextParallel::finish_hop(Hop& hop, Tensor& received) {
  receive(received);
  wait(hop);
}

void ContextParallel::attention_forward(Arena& arena, Tensor& out, Tensor& lse, const Tensor& q,
                                        const Tensor& k, const Tensor& v, std::string_view what) {
  LATTICE_CHECK(group_ != nullptr && size() > 1, "ring attention without a context-parallel group");
  Stopwatch watch;
  const int64_t B = q.dim(0), T = q.dim(1), NH = q.dim(2), HS = q.dim(3), NKV = k.dim(2);
  const int64_t c = T / 2;
  Tensor queries[2], merged[2], merged_lse[2];
  for (int j = 0; j < 2; ++j) {
    queries[j] = chunk_of(arena, q, j * c, c, q.dtype());
    merged[j] = Tensor::empty(arena, {B, c, NH, HS}, DType::kF32, kWorkspace);
    merged_lse[j] = Tensor::empty(arena, {B, NH, c}, DType::kF32, kWorkspace);
    std::fill(merged_lse[j].data<float>(), merged_lse[j].data<float>() + merged_lse[j].numel(),
              -std::numeric_limits<float>::infinity());
  }
  Tensor block_out = Tensor::empty(arena, {B, c, NH, HS}, DType::kF32, kWorkspace);
  Tensor block_lse = Tensor::empty(arena, {B, NH, c}, DType::kF32, kWorkspace);
  KvBlock held = kv_block(arena, {B, c, NKV, HS}, k.dtype(), false);
  KvBlock incoming = kv_block(arena, {B, c, NKV, HS}, k.dtype(), false);
  for (int j = 0; j < 2; ++j) {
    copy_positions(held.k(j), 0, k, j * c, c);
    copy_positions(held.v(j), 0, v, j * c, c);
  }
  const std::string hop_name = fmt::format("{} (fwd)", what);
  for (const RingHop& step : ring_schedule(size(), rank())) {
    const bool more = step.hop + 1 < size();
    Hop transfer;
    if (more) transfer = start_hop(held.data, hop_name, step.hop + 1);
    for (const RingPair& pair : step.pairs) {
      const int j = pair.query_chunk, i = pair.key_chunk;
      lattice::attention_forward(block_out, block_lse, queries[j], held.k(i), held.v(i),
                                 (pair.query_id - pair.key_id) * c);
      attention_merge(merged[j], merged_lse[j], block_out, block_lse);
    }
    if (more) {
      finish_hop(transfer, incoming.data);
      std::swap(held, incoming);
    }
  }
  for (int j = 0; j < 2; ++j) {
    copy_positions(out, j * c, merged[j], 0, c);
    copy_lse(lse, j * c, merged_lse[j], false);
  }
  stats_.seconds += watch.seconds();
}

void ContextParallel::attention_backward(Arena& arena, Tensor& dq, Tensor& dk, Tensor& dv,
                                         const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         std::string_view what) {
  LATTICE_CHECK(group_ != nullptr && size() > 1, "ring attention without a context-parallel group");
  Stopwatch watch;
  const int64_t B = q.dim(0), T = q.dim(1), NH = q.dim(2), NKV = k.dim(2), HS = q.dim(3);
  const int64_t c = T / 2;
  Tensor queries[2], grads[2], outs[2], lses[2], dqs[2];
  for (int j = 0; j < 2; ++j) {
    queries[j] = chunk_of(arena, q, j * c, c, q.dtype());
    grads[j] = chunk_of(arena, dout, j * c, c, dout.dtype());
    outs[j] = chunk_of(arena, out, j * c, c, out.dtype());
    lses[j] = Tensor::empty(arena, {B, NH, c}, DType::kF32, kWorkspace);
    copy_lse(lse, j * c, lses[j], true);
    dqs[j] = Tensor::zeros(arena, {B, c, NH, HS}, DType::kF32, kWorkspace);
  }
  KvBlock held = kv_block(arena, {B, c, NKV, HS}, k.dtype(), false);
  KvBlock incoming = kv_block(arena, {B, c, NKV, HS}, k.dtype(), false);
  // The key/value gradients of the block in hand: this rank's share, and the sum over the ranks
  // the block has visited, which arrives from the previous rank while the share is computed and
  // goes on with it added (two buffers: one is in flight while the next is filled).
  KvBlock share = kv_block(arena, {B, c, NKV, HS}, DType::kF32, false);
  KvBlock sums[2] = {kv_block(arena, {B, c, NKV, HS}, DType::kF32, false),
                     kv_block(arena, {B, c, NKV, HS}, DType::kF32, false)};
  Hop grad_transfer;
  bool grad_in_flight = false;
  for (int j = 0; j < 2; ++j) {
    copy_positions(held.k(j), 0, k, j * c, c);
    copy_positions(held.v(j), 0, v, j * c, c);
  }
  const std::string hop_name = fmt::format("{} (bwd)", what);
  const std::string grad_hop_name = fmt::format("{} dk, dv (bwd)", what);
  for (const RingHop& step : ring_schedule(size(), rank())) {
    const bool more = step.hop + 1 < size();
    Hop transfer;
    if (more) transfer = start_hop(held.data, hop_name, step.hop + 1);
    KvBlock& sum = sums[step.hop % 2];
    KvBlock& mine = step.hop == 0 ? sum : share;  // the own block: nobody has added to it yet
    mine.data.zero_();
    for (const RingPair& pair : step.pairs) {
      const int j = pair.query_chunk, i = pair.key_chunk;
      Tensor dk_block = mine.k(i), dv_block = mine.v(i);
      lattice::attention_backward(dqs[j], dk_block, dv_block, grads[j], queries[j], held.k(i),
                                  held.v(i), outs[j], lses[j], (pair.query_id - pair.key_id) * c);
    }
    if (step.hop > 0) {
      receive(sum.data);  // sent by the previous rank after its own products of this block
      axpy(sum.data, 1.0f, share.data);
    }
    // Received before this wait, so no two ranks wait on each other's receives.
    if (grad_in_flight) wait(grad_transfer);
    // The gradients go on with their block; after the last hop they reach its owner.
    grad_transfer = start_hop(sum.data, grad_hop_name, step.hop + 1);
    grad_in_flight = true;
    if (more) {
      finish_hop(transfer, incoming.data);
      std::swap(held, incoming);
    }
  }
  // This rank's own blocks' gradients, summed over every rank, from the previous one.
  KvBlock& own = sums[size() % 2];
  receive(own.data);
  wait(grad_transfer);
  for (int j = 0; j < 2; ++j) {
    copy_positions(dq, j * c, dqs[j], 0, c, true);
    copy_positions(dk, j * c, own.k(j), 0, c, true);
    copy_positions(dv, j * c, own.v(j), 0, c, true);
  }
  stats_.seconds += watch.seconds();
}

}  // namespace lattice
