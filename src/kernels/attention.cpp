// Tiled causal grouped-query attention, FlashAttention-2 (Dao, 2023), fp32 arithmetic.
//
// Work is cut into tiles of kTile = 64 queries × 64 keys: one 64×64 f32 score tile (16 KiB)
// and the q/k/v tiles it needs (64×HS f32, 16 KiB each at HS = 64) stay in L1/L2. Every inner
// product is a small GEMM done by one register-blocked micro-kernel (tile_gemm). Its A operand
// is read one element at a time and broadcast, so A may be stored transposed at no cost; only
// B must hold its rows contiguously (16-float vectors). That decides each tile's layout:
//
//   forward, one task per (b, query head, query tile); Qᵀ prepared once per task:
//     Sᵀ (keys × queries) = K · (scale·Qᵀ)   the running max/sum are then vectors over queries
//     O  (queries × HS)  += P · V            P read from Sᵀ as a transposed A
//   backward, one task per (b, kv head), so no two tasks write the same dq, dk or dv element
//   (with at most threads / 2 such pairs: a pass of key-tile tasks for dK, dV, then one of
//   query-tile tasks for dQ); key tiles outer (Kᵀ, Vᵀ prepared once), query tiles inner:
//     S  = Q · (scale·Kᵀ),  P = exp(S − lse)
//     dP = dO · Vᵀ,  dS = P ∘ (dP − D),  D = rowsum(dO ∘ O)
//     dV += Pᵀ · dO,  dK += dSᵀ · Q,  dQ += dS · K   (the 1/√HS of dK and dQ applied once)
//
// Inputs (f32 or bf16) are converted to contiguous f32 rows once per head where a head is
// reread (k and v in the forward, q and dO in the backward). On tiles that cross the diagonal,
// blocks that the causal mask zeroes are skipped. Figures: docs/performance.md, "Attention".
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/thread_budget.h"
#include "kernels/kernel_support.h"
#include "kernels/simd.h"

namespace lattice {
namespace {

// 64 queries × 64 keys: a 16 KiB score tile; 64 is also a multiple of the 16-float vector.
constexpr int64_t kTile = 64;
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

using kernel::fma_vec;
using kernel::kVecLanes;
using kernel::load_vec;
using kernel::splat;
using kernel::store_vec;
using kernel::Vec;

// Lane i holds i: lanes at or past a count are kLaneNumbers >= count.
constexpr Vec kLaneNumbers = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// ---- the micro-kernel: C (rows × cols) = [C +] A (rows × depth) · B (depth × cols).
// A element (r, k) is a[r·a_row + k·a_col] (row-major or transposed); B and C are row-major with
// leading dimensions ldb, ldc; cols is a multiple of 16.

// A block of Rows × 16·Vecs outputs kept in registers. 8 rows × 2 vectors (16 accumulators)
// needs 2 vector loads and 8 broadcasts per 16 FMAs; measured on AMD Zen 4 it runs at ~98% of
// the FMA peak from L1, where 4 × 4 (4 loads and 4 broadcasts per 16 FMAs) ran at ~78%.
constexpr int kBlockRows = 8;
constexpr int kBlockVecs = 2;

template <int Rows, int Vecs>
void gemm_block(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_col, const float* b,
                int64_t ldb, int64_t depth, bool accumulate) {
  Vec acc[Rows][Vecs];
  for (int r = 0; r < Rows; ++r) {
    for (int v = 0; v < Vecs; ++v) {
      acc[r][v] = accumulate ? load_vec(c + r * ldc + v * kVecLanes) : Vec{};
    }
  }
  for (int64_t k = 0; k < depth; ++k) {
    Vec bv[Vecs];
    for (int v = 0; v < Vecs; ++v) bv[v] = load_vec(b + k * ldb + v * kVecLanes);
    const float* a_k = a + k * a_col;
    for (int r = 0; r < Rows; ++r) {
      Vec ar = splat(a_k[r * a_row]);
      for (int v = 0; v < Vecs; ++v) acc[r][v] = fma_vec(ar, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    for (int v = 0; v < Vecs; ++v) store_vec(c + r * ldc + v * kVecLanes, acc[r][v]);
  }
}

using GemmBlockFn = void (*)(float*, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
                             int64_t, bool);
// [vectors − 1][rows − 1]: full blocks and the row and column tails of a tile.
constexpr GemmBlockFn kGemmBlocks[kBlockVecs][kBlockRows] = {
    {gemm_block<1, 1>, gemm_block<2, 1>, gemm_block<3, 1>, gemm_block<4, 1>, gemm_block<5, 1>,
     gemm_block<6, 1>, gemm_block<7, 1>, gemm_block<8, 1>},
    {gemm_block<1, 2>, gemm_block<2, 2>, gemm_block<3, 2>, gemm_block<4, 2>, gemm_block<5, 2>,
     gemm_block<6, 2>, gemm_block<7, 2>, gemm_block<8, 2>},
};

struct GemmA {
  const float* data;
  int64_t row_stride;  // distance between A(r, k) and A(r + 1, k)
  int64_t col_stride;  // distance between A(r, k) and A(r, k + 1)
};
GemmA row_major(const float* a, int64_t ld) {
  return {a, ld, 1};
}
GemmA transposed(const float* a_t, int64_t ld) {  // A = a_tᵀ, a_t stored (depth × rows)
  return {a_t, 1, ld};
}

// On tiles that cross the causal diagonal part of a product is zero or masked afterwards; a
// band says which part is not: lo ≤ (column index − row index) ≤ hi.
struct Band {
  int64_t lo = std::numeric_limits<int64_t>::min() / 2;
  int64_t hi = std::numeric_limits<int64_t>::max() / 2;
};

// C (rows × cols) = [C +] A (rows × depth) · B (depth × cols), in blocks of kBlockRows rows ×
// kBlockVecs vectors. Blocks of C entirely outside `outputs` are skipped (left as they were),
// and each block of rows sums only over the depth where A's entries lie inside `a_band`
// (A(i, k) is zero when k − i is outside it).
void tile_gemm(float* c, int64_t ldc, GemmA a, const float* b, int64_t ldb, int64_t rows,
               int64_t cols, int64_t depth, bool accumulate, Band outputs = {}, Band a_band = {}) {
  LATTICE_CHECK(cols % kVecLanes == 0, "tile_gemm: {} columns are not whole vectors", cols);
  for (int64_t r = 0; r < rows; r += kBlockRows) {
    const int64_t block_rows = std::min<int64_t>(kBlockRows, rows - r);
    const int64_t last_row = r + block_rows - 1;
    const int64_t k_begin = std::clamp<int64_t>(r + a_band.lo, 0, depth);
    const int64_t k_end = std::clamp<int64_t>(last_row + a_band.hi + 1, k_begin, depth);
    for (int64_t col = 0; col < cols; col += kBlockVecs * kVecLanes) {
      const int64_t block_vecs = std::min<int64_t>(kBlockVecs, (cols - col) / kVecLanes);
      const int64_t last_col = col + block_vecs * kVecLanes - 1;
      if (last_col - r < outputs.lo || col - last_row > outputs.hi) continue;
      kGemmBlocks[block_vecs - 1][block_rows - 1](
          c + r * ldc + col, ldc, a.data + r * a.row_stride + k_begin * a.col_stride, a.row_stride,
          a.col_stride, b + k_begin * ldb + col, ldb, k_end - k_begin, accumulate);
    }
  }
}

// ---- where the heads of q, k, v, out and their gradients lie ----

// The heads of one activation, H·HS elements of each token row that is row_width elements wide,
// from column first_column on: (B, T, H, HS) tensors (row_width H·HS, first column 0) and the q,
// k and v parts of a fused projection's output (row_width (NH + 2·NKV)·HS), read in place.
struct Heads {
  std::byte* data = nullptr;
  DType dtype = DType::kF32;
  int64_t tokens = 0;  // token rows per sequence
  int64_t row_width = 0;
  int64_t first_column = 0;
  int64_t head_size = 0;
};

// A (B, T, H, HS) tensor's heads.
Heads heads_of(const Tensor& t) {
  return {
      static_cast<std::byte*>(t.raw_data()), t.dtype(), t.dim(1), t.dim(2) * t.dim(3), 0, t.dim(3)};
}

// Heads first .. of a fused projection's output viewed as (B, T, width).
Heads heads_in(const Tensor& fused, int64_t tokens, int64_t first_head, int64_t head_size) {
  return {static_cast<std::byte*>(fused.raw_data()),
          fused.dtype(),
          tokens,
          fused.dim(-1),
          first_head * head_size,
          head_size};
}

// ---- rows of one (b, head), f32 or bf16 ----

struct HeadRows {
  std::byte* base = nullptr;  // element (b, token 0, head, 0)
  DType dtype = DType::kF32;
  size_t stride_bytes = 0;  // from token t to token t + 1

  HeadRows(const Heads& heads, int64_t b, int64_t head) : dtype(heads.dtype) {
    const size_t element = dtype_size(dtype);
    stride_bytes = size_t(heads.row_width) * element;
    base = heads.data + size_t(b * heads.tokens * heads.row_width + heads.first_column +
                               head * heads.head_size) *
                            element;
  }
  void* row(int64_t t) const { return base + size_t(t) * stride_bytes; }
};

template <class T>
void read_rows_as(const HeadRows& src, int64_t t0, int64_t count, int64_t hs, float scale,
                  float* dst, int64_t ld) {
  for (int64_t r = 0; r < count; ++r) {
    const T* p = static_cast<const T*>(src.row(t0 + r));
    float* out = dst + r * ld;
    for (int64_t i = 0; i < hs; ++i) out[i] = scale * to_float(p[i]);
  }
}

// dst row r (ld apart) = scale · row t0 + r of the head, in f32, for r < count.
void read_rows(const HeadRows& src, int64_t t0, int64_t count, int64_t hs, float scale, float* dst,
               int64_t ld) {
  if (src.dtype == DType::kF32) {
    read_rows_as<float>(src, t0, count, hs, scale, dst, ld);
  } else {
    read_rows_as<bf16>(src, t0, count, hs, scale, dst, ld);
  }
}

// Row t of the head (=, or += when accumulate) scale · src, rounded once to its dtype.
void write_row(const HeadRows& dst, int64_t t, int64_t hs, float scale, const float* src,
               bool accumulate) {
  if (dst.dtype == DType::kF32) {
    float* p = static_cast<float*>(dst.row(t));
    for (int64_t i = 0; i < hs; ++i) p[i] = (accumulate ? p[i] : 0.0f) + scale * src[i];
  } else {
    bf16* p = static_cast<bf16*>(dst.row(t));
    for (int64_t i = 0; i < hs; ++i) {
      p[i] = bf16((accumulate ? float(p[i]) : 0.0f) + scale * src[i]);
    }
  }
}

// Rows t0 .. t0 + count of a head, converted to f32 into `buffer` (count × HSP), zero beyond
// hs columns: a contiguous GEMM operand. (Reading f32 tensors in place, rows H·HS apart, was
// slower in the benchmark; a copy costs O(T·HS) against the tile products' O(T²·HS).)
struct Tile {
  const float* data;
  int64_t ld;
};
Tile copy_tile(const HeadRows& src, int64_t t0, int64_t count, int64_t hs, int64_t hsp,
               float* buffer) {
  read_rows(src, t0, count, hs, 1.0f, buffer, hsp);
  if (hs < hsp) {
    for (int64_t r = 0; r < count; ++r)
      std::fill(buffer + r * hsp + hs, buffer + (r + 1) * hsp, 0.0f);
  }
  return {buffer, hsp};
}

// The same rows scaled and transposed into tile_t (hs × kTile), zero beyond count columns;
// staged row-major in `staging` (count × hs) so the scattered accesses are reads from L1.
// Lane j of block-swap step S: rows a = r[i] and b = r[i + S] exchange their off-diagonal S × S
// blocks (a takes b's lanes j − S where bit S of j is set, b takes a's lanes j + S where it is
// not). After S = 8, 4, 2, 1 the 16 rows are transposed. __builtin_shufflevector's indices 16-31
// name b's lanes; GCC 12 and clang both have it (GCC's __builtin_shuffle clang has not).
template <int S, size_t... J>
Vec shuffle_from_both(Vec a, Vec b, std::index_sequence<J...>) {
  return __builtin_shufflevector(a, b, ((J & S) ? 16 + J - S : J)...);
}
template <int S, size_t... J>
Vec shuffle_to_both(Vec a, Vec b, std::index_sequence<J...>) {
  return __builtin_shufflevector(a, b, ((J & S) ? 16 + J : J + S)...);
}

template <int S>
void swap_blocks(Vec (&rows)[kVecLanes]) {
  for (int i = 0; i < kVecLanes; ++i) {
    if (i & S) continue;
    const Vec a = rows[i], b = rows[i + S];
    rows[i] = shuffle_from_both<S>(a, b, std::make_index_sequence<kVecLanes>{});
    rows[i + S] = shuffle_to_both<S>(a, b, std::make_index_sequence<kVecLanes>{});
  }
}

// out (16 rows, ld_out apart) = the transpose of in (16 rows, ld_in apart).
void transpose_16x16(const float* in, int64_t ld_in, float* out, int64_t ld_out) {
  Vec rows[kVecLanes];
  for (int i = 0; i < kVecLanes; ++i) rows[i] = load_vec(in + i * ld_in);
  swap_blocks<8>(rows);
  swap_blocks<4>(rows);
  swap_blocks<2>(rows);
  swap_blocks<1>(rows);
  for (int i = 0; i < kVecLanes; ++i) store_vec(out + i * ld_out, rows[i]);
}

void load_tile_transposed(const HeadRows& src, int64_t t0, int64_t count, int64_t hs, float scale,
                          float* staging, float* tile_t) {
  read_rows(src, t0, count, hs, scale, staging, hs);
  // Whole 16 × 16 blocks by vector shuffles, the rest element by element.
  const int64_t block_rows = count / kVecLanes * kVecLanes, block_cols = hs / kVecLanes * kVecLanes;
  for (int64_t r = 0; r < block_rows; r += kVecLanes) {
    for (int64_t d = 0; d < block_cols; d += kVecLanes) {
      transpose_16x16(staging + r * hs + d, hs, tile_t + d * kTile + r, kTile);
    }
  }
  for (int64_t d = 0; d < hs; ++d) {
    float* out = tile_t + d * kTile;
    const int64_t first_row = d < block_cols ? block_rows : 0;
    for (int64_t r = first_row; r < count; ++r) out[r] = staging[r * hs + d];
    std::fill(out + count, out + kTile, 0.0f);
  }
}

// ---- argument checks ----

// T queries against TK keys; query i sees key j when j ≤ i + shift (shift = the first query's
// position minus the first key's; 0 and TK = T: causal self-attention).
struct Dims {
  int64_t B, T, NH, NKV, HS;
  int64_t TK = T, shift = 0;
  int64_t padded_hs() const { return (HS + kVecLanes - 1) / kVecLanes * kVecLanes; }
  int64_t tiles() const { return (T + kTile - 1) / kTile; }
  int64_t key_tiles() const { return (TK + kTile - 1) / kTile; }
  // Keys 0 .. visible_keys(q_end) − 1 are seen by some query before q_end.
  int64_t visible_keys(int64_t q_end) const { return std::clamp<int64_t>(q_end + shift, 0, TK); }
  // The first query tile that sees key k0.
  int64_t first_query_tile(int64_t k0) const {
    return std::max<int64_t>(0, k0 - shift) / kTile * kTile;
  }
  // Query-key pairs the mask lets through, for the profile's FLOP count.
  double visible_pairs() const {
    double pairs = 0;
    for (int64_t i = 0; i < T; ++i) pairs += double(visible_keys(i + 1));
    return pairs;
  }
};

// shift < 0: self-attention, k as long as q; else a block of keys `shift` positions before the
// queries, of any length (ring attention).
Dims check_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                  int64_t shift = -1) {
  expect_float_dtype(q, op, "q");
  expect_rank(q, 4, op, "q");
  expect_rank(k, 4, op, "k");
  expect_dtype(k, q.dtype(), op, "k");
  expect_dtype(v, q.dtype(), op, "v");
  expect_same_shape(k, v, op, "k", "v");
  Dims dims{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  dims.TK = k.dim(1);
  dims.shift = std::max<int64_t>(shift, 0);
  if (k.dim(0) != dims.B || (shift < 0 && k.dim(1) != dims.T) || k.dim(3) != dims.HS) {
    LATTICE_THROW(ShapeError,
                  "{}: 'k' has shape {} but 'q' has shape {}; expected (B, {}, NKV, HS) with B{} "
                  "and HS equal to q's (B, T, NH, HS)",
                  op, k.shape().to_string(), q.shape().to_string(), shift < 0 ? "T" : "TK",
                  shift < 0 ? ", T" : "");
  }
  if (dims.HS < 1) LATTICE_THROW(ShapeError, "{}: head size (q dim 3) is 0", op);
  if (dims.NKV < 1 || dims.NH % dims.NKV != 0) {
    LATTICE_THROW(ShapeError,
                  "{}: NH = {} query heads (q dim 2) is not a multiple of NKV = {} key/value "
                  "heads (k dim 2) ---> HINT: grouped-query attention needs NH % NKV == 0",
                  op, dims.NH, dims.NKV);
  }
  return dims;
}

// The output: q's shape, in q's dtype or f32 (a ring's partial results, merged in f32).
void check_out(const char* op, const Tensor& out, const Tensor& q) {
  expect_shape(out, q.shape(), op, "out");
  if (out.dtype() != DType::kF32) expect_dtype(out, q.dtype(), op, "out");
}

void check_lse(const char* op, const Tensor& lse, const Dims& d) {
  expect_shape(lse, {d.B, d.NH, d.T}, op, "lse");
  expect_dtype(lse, DType::kF32, op, "lse");
}

// A gradient has its input's shape and is f32 or its input's dtype.
void check_grad(const char* op, const Tensor& grad, const Tensor& input, const char* what) {
  expect_shape(grad, input.shape(), op, what);
  if (grad.dtype() != DType::kF32 && grad.dtype() != input.dtype()) {
    LATTICE_THROW(DTypeError, "{}: '{}' has dtype {}, expected f32 or {} (its input's dtype)", op,
                  what, dtype_name(grad.dtype()), dtype_name(input.dtype()));
  }
}

#define LATTICE_ATTENTION_PRAGMA_(x) _Pragma(#x)
#if defined(LATTICE_USE_OPENMP)
// Tasks differ in cost (causal: later query tiles see more keys), so they are handed out one
// at a time; each task writes disjoint outputs, so results do not depend on the thread count.
#define LATTICE_ATTENTION_PARALLEL_FOR(threads) \
  LATTICE_ATTENTION_PRAGMA_(omp for schedule(dynamic, 1))
#define LATTICE_ATTENTION_PARALLEL(threads) \
  LATTICE_ATTENTION_PRAGMA_(omp parallel num_threads(threads))
#else
#define LATTICE_ATTENTION_PARALLEL_FOR(threads)
#define LATTICE_ATTENTION_PARALLEL(threads)
#endif

// ---- forward ----

struct ForwardWorkspace {
  explicit ForwardWorkspace(const Dims& d)
      : q_t(d.HS * kTile),
        k(d.key_tiles() * kTile * d.padded_hs()),
        v(d.key_tiles() * kTile * d.padded_hs()),
        s_t(kTile * kTile),
        o(kTile * d.padded_hs()),
        staging(kTile * d.padded_hs()) {}
  std::vector<float> q_t;  // (HS × kTile) scale·Qᵀ
  // Rows 0 .. kv_rows of k and v of kv head (kv_b, kv_head), (TK rounded up × HSP) each: tasks
  // run in (b, head) order, so a thread's next task usually reads the same kv head again.
  std::vector<float> k, v;
  int64_t kv_b = -1, kv_head = -1, kv_rows = 0;
  std::vector<float> s_t;      // (kTile keys × kTile queries) scores, then probabilities
  std::vector<float> o;        // (kTile × HSP) unnormalised output
  std::vector<float> staging;  // (kTile × HS), for transposing
  float row_max[kTile];        // running max of each query row
  float row_sum[kTile];        // running sum of e^(s − max) of each query row
};

// Causal mask of one score tile stored (keys × queries): key k0 + c is hidden from query q0 + r
// when it comes later.
void mask_future_keys(float* s_t, int64_t q0, int64_t k0, int64_t keys) {
  for (int64_t c = 0; c < keys; ++c) {
    float* col = s_t + c * kTile;
    int64_t first_visible = std::max<int64_t>(0, k0 + c - q0);  // first query row seeing key c
    for (int64_t r = 0; r < std::min(first_visible, kTile); ++r) col[r] = kMinusInf;
  }
}

// Online softmax over one key tile (Milakov & Gimelshein 2018): rescales the running sums and
// the output rows to the new maximum and turns s_t into probabilities e^(s − max). Query rows
// before first_visible[c] do not see key c: their scores are −∞ (mask_future_keys) and their
// probabilities 0, written without computing e^−∞. On the first key tile the running sums and
// the output rows are still 0, so there is nothing to rescale.
void online_softmax(ForwardWorkspace& ws, int64_t keys, int64_t hsp, const int64_t* first_visible,
                    bool first_tile) {
  alignas(64) float new_max[kTile], tile_sum[kTile];
  float rescale[kTile];
  for (int64_t r = 0; r < kTile; ++r) {
    new_max[r] = ws.row_max[r];
    tile_sum[r] = 0.0f;
  }
  for (int64_t c = 0; c < keys; ++c) {
    const float* col = ws.s_t.data() + c * kTile;
    for (int64_t r = 0; r < kTile; ++r) new_max[r] = col[r] > new_max[r] ? col[r] : new_max[r];
  }
  for (int64_t c = 0; c < keys; ++c) {
    float* col = ws.s_t.data() + c * kTile;
    const int64_t hidden_vecs = first_visible[c] / kVecLanes;  // whole vectors of −∞
    std::fill(col, col + hidden_vecs * kVecLanes, 0.0f);
    for (int64_t r = hidden_vecs * kVecLanes; r < kTile; r += kVecLanes) {
      const Vec p = kernel::exp_vec(load_vec(col + r) - load_vec(new_max + r));
      store_vec(col + r, p);
      store_vec(tile_sum + r, load_vec(tile_sum + r) + p);
    }
  }
  if (first_tile) {
    std::copy(tile_sum, tile_sum + kTile, ws.row_sum);
    std::copy(new_max, new_max + kTile, ws.row_max);
    return;
  }
  for (int64_t r = 0; r < kTile; ++r) rescale[r] = kernel::exp_fast(ws.row_max[r] - new_max[r]);
  for (int64_t r = 0; r < kTile; ++r) {
    ws.row_sum[r] = ws.row_sum[r] * rescale[r] + tile_sum[r];
    ws.row_max[r] = new_max[r];
    float* o_row = ws.o.data() + r * hsp;
    for (int64_t i = 0; i < hsp; ++i) o_row[i] *= rescale[r];
  }
}

struct ForwardArgs {
  Dims dims;
  Heads out, q, k, v;
  float* lse;
};

// Makes rows 0 .. rows of kv head (b, kv_head) available in ws.k and ws.v, converting only the
// rows an earlier task of this thread has not.
void convert_kv_rows(const ForwardArgs& args, ForwardWorkspace& ws, int64_t b, int64_t kv_head,
                     int64_t rows) {
  if (ws.kv_b != b || ws.kv_head != kv_head) {
    ws.kv_b = b;
    ws.kv_head = kv_head;
    ws.kv_rows = 0;
  }
  if (rows <= ws.kv_rows) return;
  const int64_t hs = args.dims.HS, hsp = args.dims.padded_hs(), first = ws.kv_rows;
  copy_tile(HeadRows(args.k, b, kv_head), first, rows - first, hs, hsp, ws.k.data() + first * hsp);
  copy_tile(HeadRows(args.v, b, kv_head), first, rows - first, hs, hsp, ws.v.data() + first * hsp);
  ws.kv_rows = rows;
}

void forward_query_tile(const ForwardArgs& args, ForwardWorkspace& ws, int64_t b, int64_t h,
                        int64_t q0) {
  const Dims& d = args.dims;
  const int64_t hsp = d.padded_hs();
  const int64_t kv_head = h / (d.NH / d.NKV);
  const int64_t queries = std::min(kTile, d.T - q0);
  const float scale = 1.0f / std::sqrt(float(d.HS));
  HeadRows q(args.q, b, h), out(args.out, b, h);
  const int64_t keys_seen = d.visible_keys(q0 + queries);
  convert_kv_rows(args, ws, b, kv_head, keys_seen);

  load_tile_transposed(q, q0, queries, d.HS, scale, ws.staging.data(), ws.q_t.data());
  std::fill(ws.o.begin(), ws.o.end(), 0.0f);
  std::fill(ws.row_max, ws.row_max + kTile, kMinusInf);
  std::fill(ws.row_sum, ws.row_sum + kTile, 0.0f);
  // Every query row sees key 0 (shift ≥ 0), so after the first key tile each running max is
  // finite.
  const int64_t qs = q0 + d.shift;  // the query tile's first position in key coordinates
  for (int64_t k0 = 0; k0 < keys_seen; k0 += kTile) {
    const int64_t keys = std::min(kTile, d.TK - k0);
    const Tile k_tile{ws.k.data() + k0 * hsp, hsp};
    const Tile v_tile{ws.v.data() + k0 * hsp, hsp};
    // Sᵀ (keys × kTile queries) = K (keys × HS) · scale·Qᵀ (HS × kTile)
    // Only scores of query q0 + r and key k0 + c with r − c ≥ k0 − qs are visible; blocks of
    // hidden ones are skipped and then masked.
    const Band visible_scores{.lo = k0 - qs};
    tile_gemm(ws.s_t.data(), kTile, row_major(k_tile.data, k_tile.ld), ws.q_t.data(), kTile, keys,
              kTile, d.HS, false, visible_scores);
    int64_t first_visible[kTile] = {};  // the first query row that sees key k0 + c
    if (k0 + keys - 1 > qs) {
      mask_future_keys(ws.s_t.data(), qs, k0, keys);
      for (int64_t c = 0; c < keys; ++c) {
        first_visible[c] = std::clamp<int64_t>(k0 + c - qs, 0, kTile);
      }
    }
    online_softmax(ws, keys, hsp, first_visible, k0 == 0);
    // O (queries × HSP) += P (queries × keys) · V (keys × HSP), P read from Sᵀ.
    tile_gemm(ws.o.data(), hsp, transposed(ws.s_t.data(), kTile), v_tile.data, v_tile.ld, queries,
              hsp, keys, true, {}, Band{.hi = qs - k0});
  }
  float* lse = args.lse + (b * d.NH + h) * d.T + q0;
  for (int64_t r = 0; r < queries; ++r) {
    write_row(out, q0 + r, d.HS, 1.0f / ws.row_sum[r], ws.o.data() + r * hsp, false);
    lse[r] = ws.row_max[r] + std::log(ws.row_sum[r]);
  }
}

// ---- backward ----

struct BackwardWorkspace {
  explicit BackwardWorkspace(const Dims& d)
      : k(kTile * d.padded_hs()),
        k_t(d.HS * kTile),
        v_t(d.HS * kTile),
        q(d.tiles() * kTile * d.padded_hs()),
        dout(d.tiles() * kTile * d.padded_hs()),
        p(kTile * kTile),
        ds(kTile * kTile),
        dq(d.tiles() * kTile * d.padded_hs()),
        dk(d.key_tiles() * kTile * d.padded_hs()),
        dv(d.key_tiles() * kTile * d.padded_hs()),
        delta(d.T),
        staging(kTile * d.padded_hs()) {}
  std::vector<float> k, k_t, v_t;  // key tile: (kTile × HSP), scale·Kᵀ and Vᵀ (HS × kTile)
  std::vector<float> q, dout;      // one query head, (T rounded up × HSP) each
  std::vector<float> p, ds;        // (kTile queries × kTile keys)
  std::vector<float> dq, dk, dv;   // fp32 sums over one head, (T or TK rounded up × HSP)
  std::vector<float> delta;        // D = rowsum(dO ∘ O) of one query head, (T)
  std::vector<float> staging;      // (kTile × HS), for transposing; kTile rows of out
};

struct BackwardArgs {
  Dims dims;
  Heads dq, dk, dv, dout, q, k, v, out;
  const float* lse;
  // false: dq, dk and dv are written (the fused projection's gradient, every element once);
  // true: added to.
  bool accumulate = true;
};

// P = exp(S − lse) over one (queries × keys) tile, 0 for keys after the query or past TK; then
// dS = P ∘ (dP − D), with dP arriving in ds. On vectors of 16 keys, a row's last visible vector
// included: exp_vec gives exp_fast's bits lane by lane (kernels/simd.h), and its hidden lanes
// are set to 0, as tile_gemm left whatever was there in the blocks it skipped.
void probabilities_and_score_grads(BackwardWorkspace& ws, const float* lse, const float* delta,
                                   int64_t qs, int64_t k0, int64_t queries, int64_t keys) {
  for (int64_t r = 0; r < queries; ++r) {
    float* p = ws.p.data() + r * kTile;
    float* ds = ws.ds.data() + r * kTile;
    // Keys k0 .. k0 + visible − 1 are at or before query qs + r (in key coordinates).
    const int64_t visible = std::clamp<int64_t>(qs + r - k0 + 1, 0, keys);
    for (int64_t c = 0; c < kTile; c += kVecLanes) {
      Vec pc{}, dsc{};
      if (c < visible) {
        pc = kernel::exp_vec(load_vec(p + c) - lse[r]);
        dsc = pc * (load_vec(ds + c) - delta[r]);
        if (visible - c < kVecLanes) {  // the hidden lanes computed from whatever was there: 0
          const auto hidden = kLaneNumbers >= float(visible - c);
          pc = hidden ? Vec{} : pc;
          dsc = hidden ? Vec{} : dsc;
        }
      }
      store_vec(p + c, pc);
      store_vec(ds + c, dsc);
    }
  }
}

// Rows first .. last of query head (b, h): q and dO converted into ws.q and ws.dout, and
// D = rowsum(dO ∘ O) into ws.delta, all indexed by absolute row.
void prepare_query_rows(const BackwardArgs& args, BackwardWorkspace& ws, int64_t b, int64_t h,
                        int64_t first, int64_t last) {
  const Dims& d = args.dims;
  const int64_t hsp = d.padded_hs();
  copy_tile(HeadRows(args.q, b, h), first, last - first, d.HS, hsp, ws.q.data() + first * hsp);
  copy_tile(HeadRows(args.dout, b, h), first, last - first, d.HS, hsp,
            ws.dout.data() + first * hsp);
  const HeadRows out(args.out, b, h);
  for (int64_t t0 = first; t0 < last; t0 += kTile) {  // kTile rows of out at a time in staging
    const int64_t rows = std::min(kTile, last - t0);
    read_rows(out, t0, rows, d.HS, 1.0f, ws.staging.data(), d.HS);
    for (int64_t t = t0; t < t0 + rows; ++t) {
      const float* dout_row = ws.dout.data() + t * hsp;
      const float* out_row = ws.staging.data() + (t - t0) * d.HS;
      ws.delta[t] = kernel::sum_lanes(d.HS, [&](int64_t i) { return dout_row[i] * out_row[i]; });
    }
  }
}

// Key tile k0 of kv head (b, kv_head): K into ws.k (keys × HSP), scale·Kᵀ and Vᵀ into ws.k_t
// and ws.v_t (HS × kTile).
void prepare_key_tile(const BackwardArgs& args, BackwardWorkspace& ws, int64_t b, int64_t kv_head,
                      int64_t k0, int64_t keys) {
  const Dims& d = args.dims;
  const float scale = 1.0f / std::sqrt(float(d.HS));
  const HeadRows k(args.k, b, kv_head), v(args.v, b, kv_head);
  copy_tile(k, k0, keys, d.HS, d.padded_hs(), ws.k.data());
  load_tile_transposed(k, k0, keys, d.HS, scale, ws.staging.data(), ws.k_t.data());
  load_tile_transposed(v, k0, keys, d.HS, 1.0f, ws.staging.data(), ws.v_t.data());
}

// Query tile q0 of head h (prepared) against key tile k0 (prepared): P into ws.p and dS into
// ws.ds, (queries × kTile) each.
void tile_probabilities(const BackwardArgs& args, BackwardWorkspace& ws, int64_t b, int64_t h,
                        int64_t q0, int64_t queries, int64_t k0, int64_t keys) {
  const Dims& d = args.dims;
  const int64_t hsp = d.padded_hs();
  // Query q0 + r sees key k0 + c when c − r ≤ q0 + shift − k0: skip blocks entirely outside.
  const int64_t qs = q0 + d.shift;
  const Band visible{.hi = qs - k0};
  // S (queries × kTile) = Q · scale·Kᵀ;  dP (queries × kTile) = dO · Vᵀ
  tile_gemm(ws.p.data(), kTile, row_major(ws.q.data() + q0 * hsp, hsp), ws.k_t.data(), kTile,
            queries, kTile, d.HS, false, visible);
  tile_gemm(ws.ds.data(), kTile, row_major(ws.dout.data() + q0 * hsp, hsp), ws.v_t.data(), kTile,
            queries, kTile, d.HS, false, visible);
  probabilities_and_score_grads(ws, args.lse + (b * d.NH + h) * d.T + q0, ws.delta.data() + q0, qs,
                                k0, queries, keys);
}

// dV (keys × HSP) += Pᵀ · dO and dK += dSᵀ · Q into the rows of key tile k0 of ws.dv, ws.dk.
void accumulate_key_grads(const Dims& d, BackwardWorkspace& ws, int64_t q0, int64_t queries,
                          int64_t k0, int64_t keys) {
  const int64_t hsp = d.padded_hs();
  // Pᵀ(c, r) is zero unless r − c ≥ k0 − (q0 + shift)
  const Band visible_transposed{.lo = k0 - q0 - d.shift};
  tile_gemm(ws.dv.data() + k0 * hsp, hsp, transposed(ws.p.data(), kTile), ws.dout.data() + q0 * hsp,
            hsp, keys, hsp, queries, true, {}, visible_transposed);
  tile_gemm(ws.dk.data() + k0 * hsp, hsp, transposed(ws.ds.data(), kTile), ws.q.data() + q0 * hsp,
            hsp, keys, hsp, queries, true, {}, visible_transposed);
}

// dQ (queries × HSP) += dS · K into the rows of query tile q0 of ws.dq.
void accumulate_query_grads(const Dims& d, BackwardWorkspace& ws, int64_t q0, int64_t queries,
                            int64_t k0, int64_t keys) {
  const int64_t hsp = d.padded_hs();
  tile_gemm(ws.dq.data() + q0 * hsp, hsp, row_major(ws.ds.data(), kTile), ws.k.data(), hsp, queries,
            hsp, keys, true, {}, Band{.hi = q0 + d.shift - k0});
}

// Rows first .. last of an fp32 sum (rows HSP apart), times scale, written to (or, with
// args.accumulate, added to) a head's rows of a gradient.
void store_rows(const BackwardArgs& args, const Heads& grad, int64_t b, int64_t head,
                const std::vector<float>& sum, int64_t first, int64_t last, float scale) {
  const HeadRows rows(grad, b, head);
  const int64_t hs = args.dims.HS, hsp = args.dims.padded_hs();
  for (int64_t t = first; t < last; ++t) {
    write_row(rows, t, hs, scale, sum.data() + t * hsp, args.accumulate);
  }
}

// The whole backward of kv head (b, kv_head) and its query heads, key tiles outer: each P and
// dS tile is computed once and feeds dV, dK and dQ.
void backward_kv_head(const BackwardArgs& args, BackwardWorkspace& ws, int64_t b, int64_t kv_head) {
  const Dims& d = args.dims;
  const int64_t group = d.NH / d.NKV;
  const float scale = 1.0f / std::sqrt(float(d.HS));
  std::fill(ws.dk.begin(), ws.dk.end(), 0.0f);
  std::fill(ws.dv.begin(), ws.dv.end(), 0.0f);
  for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    prepare_query_rows(args, ws, b, h, 0, d.T);
    std::fill(ws.dq.begin(), ws.dq.end(), 0.0f);
    for (int64_t k0 = 0; k0 < d.visible_keys(d.T); k0 += kTile) {
      const int64_t keys = std::min(kTile, d.TK - k0);
      prepare_key_tile(args, ws, b, kv_head, k0, keys);
      // Query tiles from the diagonal on: earlier queries see none of these keys.
      for (int64_t q0 = d.first_query_tile(k0); q0 < d.T; q0 += kTile) {
        const int64_t queries = std::min(kTile, d.T - q0);
        tile_probabilities(args, ws, b, h, q0, queries, k0, keys);
        accumulate_key_grads(d, ws, q0, queries, k0, keys);
        accumulate_query_grads(d, ws, q0, queries, k0, keys);
      }
    }
    store_rows(args, args.dq, b, h, ws.dq, 0, d.T, scale);
  }
  store_rows(args, args.dk, b, kv_head, ws.dk, 0, d.TK, scale);
  store_rows(args, args.dv, b, kv_head, ws.dv, 0, d.TK, 1.0f);
}

// The same sums split in two passes for more parallelism, at the price of computing P and dS
// twice (7 tile products instead of 5). Every tile product, and every sum's order, is the one
// backward_kv_head uses, so the results are bitwise the same.
//
// Pass 1, one key tile: dK and dV of its rows, over the query heads of the group.
void backward_key_tile(const BackwardArgs& args, BackwardWorkspace& ws, int64_t b, int64_t kv_head,
                       int64_t k0) {
  const Dims& d = args.dims;
  const int64_t group = d.NH / d.NKV, hsp = d.padded_hs();
  const int64_t keys = std::min(kTile, d.TK - k0);
  std::fill(ws.dk.begin() + k0 * hsp, ws.dk.begin() + (k0 + kTile) * hsp, 0.0f);
  std::fill(ws.dv.begin() + k0 * hsp, ws.dv.begin() + (k0 + kTile) * hsp, 0.0f);
  prepare_key_tile(args, ws, b, kv_head, k0, keys);
  const int64_t q_first = d.first_query_tile(k0);
  for (int64_t h = kv_head * group; h < (kv_head + 1) * group && q_first < d.T; ++h) {
    prepare_query_rows(args, ws, b, h, q_first, d.T);
    for (int64_t q0 = q_first; q0 < d.T; q0 += kTile) {
      const int64_t queries = std::min(kTile, d.T - q0);
      tile_probabilities(args, ws, b, h, q0, queries, k0, keys);
      accumulate_key_grads(d, ws, q0, queries, k0, keys);
    }
  }
  store_rows(args, args.dk, b, kv_head, ws.dk, k0, k0 + keys, 1.0f / std::sqrt(float(d.HS)));
  store_rows(args, args.dv, b, kv_head, ws.dv, k0, k0 + keys, 1.0f);
}

// Pass 2, one query tile: dQ of its rows, over the key tiles up to the diagonal.
void backward_query_tile(const BackwardArgs& args, BackwardWorkspace& ws, int64_t b, int64_t h,
                         int64_t q0) {
  const Dims& d = args.dims;
  const int64_t hsp = d.padded_hs(), kv_head = h / (d.NH / d.NKV);
  const int64_t queries = std::min(kTile, d.T - q0);
  std::fill(ws.dq.begin() + q0 * hsp, ws.dq.begin() + (q0 + kTile) * hsp, 0.0f);
  prepare_query_rows(args, ws, b, h, q0, q0 + queries);
  for (int64_t k0 = 0; k0 < d.visible_keys(q0 + queries); k0 += kTile) {
    const int64_t keys = std::min(kTile, d.TK - k0);
    prepare_key_tile(args, ws, b, kv_head, k0, keys);
    tile_probabilities(args, ws, b, h, q0, queries, k0, keys);
    accumulate_query_grads(d, ws, q0, queries, k0, keys);
  }
  store_rows(args, args.dq, b, h, ws.dq, q0, q0 + queries, 1.0f / std::sqrt(float(d.HS)));
}

}  // namespace

namespace {

void run_forward(const ForwardArgs& args) {
  const Dims& d = args.dims;
  const int64_t tiles = d.tiles();
  const int64_t tasks = d.B * d.NH * tiles;
  LATTICE_ATTENTION_PARALLEL(int(std::min<int64_t>(thread_budget(), tasks))) {
    ForwardWorkspace ws(d);
    LATTICE_ATTENTION_PARALLEL_FOR()
    for (int64_t task = 0; task < tasks; ++task) {
      // The costliest tiles (last queries, most keys) first, for balance.
      const int64_t q_tile = tiles - 1 - task % tiles;
      const int64_t bh = task / tiles;
      forward_query_tile(args, ws, bh / d.NH, bh % d.NH, q_tile * kTile);
    }
  }
}

void run_backward(const BackwardArgs& args) {
  const Dims& d = args.dims;
  const int threads = thread_budget();
  // The split passes cost ~1.6× the fused backward on one thread (measured: 7 tile products
  // instead of 5, plus key tiles prepared per query tile), so they pay only from 2 threads per
  // (b, kv head) pair on.
  if (threads < 2 * d.B * d.NKV) {
    // One task per (b, kv head) owns dk and dv of that head and dq of its query heads: no two
    // tasks write the same element.
    const int64_t tasks = d.B * d.NKV;
    LATTICE_ATTENTION_PARALLEL(int(std::min<int64_t>(threads, tasks))) {
      BackwardWorkspace ws(d);
      LATTICE_ATTENTION_PARALLEL_FOR()
      for (int64_t task = 0; task < tasks; ++task) {
        backward_kv_head(args, ws, task / d.NKV, task % d.NKV);
      }
    }
    return;
  }
  // Few (b, kv head) pairs for the threads: tasks per key tile, then per query tile.
  const int64_t tiles = d.tiles(), key_tiles = d.key_tiles();
  LATTICE_ATTENTION_PARALLEL(threads) {
    BackwardWorkspace ws(d);
    LATTICE_ATTENTION_PARALLEL_FOR()
    for (int64_t task = 0; task < d.B * d.NKV * key_tiles; ++task) {
      const int64_t bkv = task / key_tiles;  // first key tiles have the most queries: first
      backward_key_tile(args, ws, bkv / d.NKV, bkv % d.NKV, (task % key_tiles) * kTile);
    }
    LATTICE_ATTENTION_PARALLEL_FOR()
    for (int64_t task = 0; task < d.B * d.NH * tiles; ++task) {
      const int64_t bh = task / tiles;  // last query tiles have the most keys: first
      backward_query_tile(args, ws, bh / d.NH, bh % d.NH, (tiles - 1 - task % tiles) * kTile);
    }
  }
}

// QKᵀ and PV over the visible pairs, 2 FLOPs a multiply-add.
double forward_flops(const Dims& d) {
  return 4.0 * double(d.B * d.NH) * d.visible_pairs() * double(d.HS);
}
// Five products over the visible pairs: QKᵀ again, dP = dO·Vᵀ, dV, dQ and dK.
double backward_flops(const Dims& d) {
  return 10.0 * double(d.B * d.NH) * d.visible_pairs() * double(d.HS);
}

void forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
             int64_t shift) {
  constexpr const char* kOp = "attention_forward";
  const Dims d = check_inputs(kOp, q, k, v, shift);
  const KernelTimer timer("attention fwd", forward_flops(d), kernel::bytes_of({&out, &q, &k, &v}));
  check_out(kOp, out, q);
  check_lse(kOp, lse, d);
  if (q.numel() == 0) return;
  run_forward({d, heads_of(out), heads_of(q), heads_of(k), heads_of(v), lse.data<float>()});
}

void backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
              int64_t shift) {
  constexpr const char* kOp = "attention_backward";
  const Dims d = check_inputs(kOp, q, k, v, shift);
  const KernelTimer timer("attention bwd", backward_flops(d),
                          kernel::bytes_of({&dq, &dk, &dv, &dout, &q, &k, &v, &out}));
  check_out(kOp, out, q);
  expect_shape(dout, q.shape(), kOp, "dout");
  expect_float_dtype(dout, kOp, "dout");
  check_lse(kOp, lse, d);
  check_grad(kOp, dq, q, "dq");
  check_grad(kOp, dk, k, "dk");
  check_grad(kOp, dv, v, "dv");
  if (q.numel() == 0) return;
  run_backward({d, heads_of(dq), heads_of(dk), heads_of(dv), heads_of(dout), heads_of(q),
                heads_of(k), heads_of(v), heads_of(out), lse.data<float>(), true});
}

// The dimensions of attention over a fused projection's output qkv (B·T rows of (NH + 2·NKV)·HS:
// the query heads, then the key heads, then the value heads), with out (B, T, NH, HS).
Dims check_fused_inputs(const char* op, const Tensor& qkv, const Tensor& out) {
  expect_float_dtype(qkv, op, "qkv");
  expect_rank(out, 4, op, "out");
  const int64_t B = out.dim(0), T = out.dim(1), NH = out.dim(2), HS = out.dim(3);
  const int64_t width = qkv.rank() == 0 ? 0 : qkv.dim(-1);
  const int64_t kv_width = width - NH * HS;
  if (HS < 1 || qkv.rank() < 2 || kernel::rows_of(qkv) != B * T || kv_width < 2 * HS ||
      kv_width % (2 * HS) != 0 || NH % (kv_width / (2 * HS)) != 0) {
    LATTICE_THROW(ShapeError,
                  "{}: 'qkv' has shape {} but 'out' has shape {}; expected {} rows of (NH + 2·NKV)"
                  "·HS with NH = {}, HS = {} and NH % NKV == 0 ---> HINT: pass the fused q, k, v "
                  "projection of the same tokens, query heads first, then key heads, then value "
                  "heads",
                  op, qkv.shape().to_string(), out.shape().to_string(), B * T, NH, HS);
  }
  if (out.dtype() != DType::kF32) expect_dtype(out, qkv.dtype(), op, "out");
  return Dims{B, T, NH, kv_width / (2 * HS), HS};
}

// q, k and v of the fused projection's output, read in place.
struct FusedHeads {
  Heads q, k, v;
};
FusedHeads fused_heads(const Tensor& qkv, const Dims& d) {
  return {heads_in(qkv, d.T, 0, d.HS), heads_in(qkv, d.T, d.NH, d.HS),
          heads_in(qkv, d.T, d.NH + d.NKV, d.HS)};
}

void check_shift(const char* op, int64_t shift) {
  if (shift < 0) {
    LATTICE_THROW(ValueError,
                  "{}: the queries start {} positions before their keys; some queries would see "
                  "no key ---> HINT: pass key blocks that start at or before the queries (shift "
                  ">= 0) and skip blocks entirely in the future",
                  op, -shift);
  }
}

}  // namespace

void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v) {
  forward(out, lse, q, k, v, -1);
}

void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       int64_t shift) {
  check_shift("attention_forward", shift);
  forward(out, lse, q, k, v, shift);
}

void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  backward(dq, dk, dv, dout, q, k, v, out, lse, -1);
}

void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        int64_t shift) {
  check_shift("attention_backward", shift);
  backward(dq, dk, dv, dout, q, k, v, out, lse, shift);
}

void attention_forward_qkv(Tensor& out, Tensor& lse, const Tensor& qkv) {
  constexpr const char* kOp = "attention_forward_qkv";
  const Dims d = check_fused_inputs(kOp, qkv, out);
  const KernelTimer timer("attention fwd", forward_flops(d), kernel::bytes_of({&out, &qkv}));
  check_lse(kOp, lse, d);
  if (out.numel() == 0) return;
  const FusedHeads in = fused_heads(qkv, d);
  run_forward({d, heads_of(out), in.q, in.k, in.v, lse.data<float>()});
}

void attention_backward_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                            const Tensor& lse) {
  constexpr const char* kOp = "attention_backward_qkv";
  const Dims d = check_fused_inputs(kOp, qkv, out);
  const KernelTimer timer("attention bwd", backward_flops(d),
                          kernel::bytes_of({&dqkv, &dout, &qkv, &out}));
  expect_shape(dout, out.shape(), kOp, "dout");
  expect_float_dtype(dout, kOp, "dout");
  check_lse(kOp, lse, d);
  check_grad(kOp, dqkv, qkv, "dqkv");
  if (dqkv.raw_data() == qkv.raw_data()) {
    LATTICE_THROW(ValueError,
                  "{}: 'dqkv' is 'qkv' itself; the backward reads q, k and v there while it writes "
                  "their gradient ---> HINT: give dqkv a buffer of its own",
                  kOp);
  }
  if (out.numel() == 0) return;
  const FusedHeads in = fused_heads(qkv, d), grad = fused_heads(dqkv, d);
  run_backward({d, grad.q, grad.k, grad.v, heads_of(dout), in.q, in.k, in.v, heads_of(out),
                lse.data<float>(), false});
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse) {
  constexpr const char* kOp = "attention_merge";
  expect_rank(out, 4, kOp, "out");
  expect_dtype(out, DType::kF32, kOp, "out");
  expect_dtype(block_out, DType::kF32, kOp, "block_out");
  expect_same_shape(out, block_out, kOp, "out", "block_out");
  const int64_t B = out.dim(0), T = out.dim(1), NH = out.dim(2), HS = out.dim(3);
  expect_shape(lse, {B, NH, T}, kOp, "lse");
  expect_shape(block_lse, {B, NH, T}, kOp, "block_lse");
  expect_dtype(lse, DType::kF32, kOp, "lse");
  expect_dtype(block_lse, DType::kF32, kOp, "block_lse");
  float* o = out.data<float>();
  const float* bo = block_out.data<float>();
  float* l = lse.data<float>();
  const float* bl = block_lse.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        float& lse_row = l[(b * NH + h) * T + t];
        const float block = bl[(b * NH + h) * T + t];
        float* row = o + ((b * T + t) * NH + h) * HS;
        const float* block_row = bo + ((b * T + t) * NH + h) * HS;
        if (lse_row == kMinusInf) {  // nothing merged yet
          std::copy(block_row, block_row + HS, row);
          lse_row = block;
          continue;
        }
        const float high = std::max(lse_row, block);
        const float merged = high + std::log(std::exp(lse_row - high) + std::exp(block - high));
        const float keep = std::exp(lse_row - merged), add = std::exp(block - merged);
        for (int64_t i = 0; i < HS; ++i) row[i] = keep * row[i] + add * block_row[i];
        lse_row = merged;
      }
    }
  }
}

}  // namespace lattice
