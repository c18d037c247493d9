// Tiled causal grouped-query attention against a naive softmax(QKᵀ/√HS)V computed in double
// precision, whose own backward is checked by central finite differences.
#include "kernels/attention.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/thread_budget.h"
#include "kernels/op_registry.h"

namespace lattice {
namespace {

struct Dims {
  int64_t B, T, NH, NKV, HS;
};

std::string describe(const Dims& d) {
  return fmt::format("B={} T={} NH={} NKV={} HS={}", d.B, d.T, d.NH, d.NKV, d.HS);
}

// ---- the naive reference, double precision, on the values the kernel sees ----

std::vector<double> values_of(const Tensor& t) {
  std::vector<float> f(size_t(t.numel()));
  convert(t.raw_data(), t.dtype(), f.data(), DType::kF32, t.numel());
  return {f.begin(), f.end()};
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// Element (b, t, head, i) of a (B, T, H, HS) array.
size_t at(const Dims& d, int64_t heads, int64_t b, int64_t t, int64_t head, int64_t i) {
  return size_t(((b * d.T + t) * heads + head) * d.HS + i);
}

// out = softmax(q kᵀ/√HS + causal mask) v per head; with dout, also the analytic gradients.
Reference naive_attention(const Dims& d, const std::vector<double>& q, const std::vector<double>& k,
                          const std::vector<double>& v, const std::vector<double>* dout) {
  Reference ref;
  ref.out.assign(q.size(), 0.0);
  ref.lse.assign(size_t(d.B * d.NH * d.T), 0.0);
  ref.dq.assign(q.size(), 0.0);
  ref.dk.assign(k.size(), 0.0);
  ref.dv.assign(v.size(), 0.0);
  const double scale = 1.0 / std::sqrt(double(d.HS));
  std::vector<double> p(size_t(d.T)), dp(size_t(d.T));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.NH; ++h) {
      const int64_t g = h / (d.NH / d.NKV);
      for (int64_t t = 0; t < d.T; ++t) {
        double max = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < d.HS; ++i) {
            dot += q[at(d, d.NH, b, t, h, i)] * k[at(d, d.NKV, b, s, g, i)];
          }
          p[size_t(s)] = dot * scale;
          max = std::max(max, p[size_t(s)]);
        }
        double sum = 0;
        for (int64_t s = 0; s <= t; ++s) sum += std::exp(p[size_t(s)] - max);
        ref.lse[size_t((b * d.NH + h) * d.T + t)] = max + std::log(sum);
        for (int64_t s = 0; s <= t; ++s) p[size_t(s)] = std::exp(p[size_t(s)] - max) / sum;
        for (int64_t s = 0; s <= t; ++s) {
          for (int64_t i = 0; i < d.HS; ++i) {
            ref.out[at(d, d.NH, b, t, h, i)] += p[size_t(s)] * v[at(d, d.NKV, b, s, g, i)];
          }
        }
        if (dout == nullptr) continue;
        // dP = dout·v_s, dS = P (dP − Σ P dP), dq = scale Σ dS k_s, dk_s += scale dS q, dv_s += P
        // dout
        double weighted = 0;
        for (int64_t s = 0; s <= t; ++s) {
          dp[size_t(s)] = 0;
          for (int64_t i = 0; i < d.HS; ++i) {
            dp[size_t(s)] += (*dout)[at(d, d.NH, b, t, h, i)] * v[at(d, d.NKV, b, s, g, i)];
          }
          weighted += p[size_t(s)] * dp[size_t(s)];
        }
        for (int64_t s = 0; s <= t; ++s) {
          const double ds = p[size_t(s)] * (dp[size_t(s)] - weighted);
          for (int64_t i = 0; i < d.HS; ++i) {
            ref.dq[at(d, d.NH, b, t, h, i)] += scale * ds * k[at(d, d.NKV, b, s, g, i)];
            ref.dk[at(d, d.NKV, b, s, g, i)] += scale * ds * q[at(d, d.NH, b, t, h, i)];
            ref.dv[at(d, d.NKV, b, s, g, i)] += p[size_t(s)] * (*dout)[at(d, d.NH, b, t, h, i)];
          }
        }
      }
    }
  }
  return ref;
}

// ---- test data ----

// Uniform values in [low, high) from (seed, key), stored in t's dtype (bf16 rounds them).
void fill(Tensor& t, uint64_t key, float low = -1.0f, float high = 1.0f) {
  std::vector<float> values(size_t(t.numel()));
  fill_uniform(values.data(), t.numel(), 1234, key, 0, low, high);
  convert(values.data(), DType::kF32, t.raw_data(), t.dtype(), t.numel());
}

struct Problem {
  Problem(Arena& arena, const Dims& dims, DType dtype) : d(dims) {
    q = Tensor::empty(arena, {d.B, d.T, d.NH, d.HS}, dtype);
    k = Tensor::empty(arena, {d.B, d.T, d.NKV, d.HS}, dtype);
    v = Tensor::empty(arena, {d.B, d.T, d.NKV, d.HS}, dtype);
    dout = Tensor::empty(arena, {d.B, d.T, d.NH, d.HS}, dtype);
    // Scores of several units make the softmax far from uniform, so the test sees the max
    // subtraction and the masking.
    fill(q, 1, -2.0f, 2.0f);
    fill(k, 2, -2.0f, 2.0f);
    fill(v, 3);
    fill(dout, 4);
    out = Tensor::empty(arena, q.shape(), dtype);
    lse = Tensor::empty(arena, {d.B, d.NH, d.T}, DType::kF32);
    dq = Tensor::zeros(arena, q.shape(), DType::kF32);
    dk = Tensor::zeros(arena, k.shape(), DType::kF32);
    dv = Tensor::zeros(arena, v.shape(), DType::kF32);
  }
  void forward() { attention_forward(out, lse, q, k, v); }
  void backward() { attention_backward(dq, dk, dv, dout, q, k, v, out, lse); }
  Reference reference() const {
    std::vector<double> dout_values = values_of(dout);
    return naive_attention(d, values_of(q), values_of(k), values_of(v), &dout_values);
  }

  Dims d;
  Tensor q, k, v, dout, out, lse, dq, dk, dv;
};

// max |got − want| ≤ tolerance · max(1, max |want|)
void expect_close(const Tensor& got, const std::vector<double>& want, double tolerance,
                  const std::string& what) {
  std::vector<double> values = values_of(got);
  ASSERT_EQ(values.size(), want.size()) << what;
  double magnitude = 1.0, worst = 0.0;
  size_t worst_index = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    magnitude = std::max(magnitude, std::abs(want[i]));
    double error = std::abs(values[i] - want[i]);
    if (!(error <= worst)) {  // also catches NaN
      worst = error;
      worst_index = i;
    }
  }
  EXPECT_LE(worst, tolerance * magnitude)
      << what << ": element " << worst_index << " is " << values[worst_index] << ", expected "
      << want[worst_index];
}

// ---- forward and backward against the reference, fp32 ----

class AttentionShapes : public ::testing::TestWithParam<Dims> {};

TEST_P(AttentionShapes, ForwardAndBackwardMatchNaiveDoubleReference) {
  const Dims d = GetParam();
  SCOPED_TRACE(describe(d));
  Arena arena("attention_test");
  Problem pr(arena, d, DType::kF32);
  pr.forward();
  pr.backward();
  const Reference ref = pr.reference();
  expect_close(pr.out, ref.out, 2e-6, "out");
  expect_close(pr.lse, ref.lse, 2e-6, "lse");
  expect_close(pr.dq, ref.dq, 1e-5, "dq");
  expect_close(pr.dk, ref.dk, 1e-5, "dk");
  expect_close(pr.dv, ref.dv, 1e-5, "dv");
}

// GQA groups of 2, 4 (NKV = 1) and 1 (NKV = NH); T of one row, below one tile, just past one
// and two tiles; head sizes that are and are not whole 16-float vectors.
INSTANTIATE_TEST_SUITE_P(Kernels, AttentionShapes,
                         ::testing::Values(Dims{1, 1, 4, 2, 16}, Dims{2, 5, 4, 2, 8},
                                           Dims{1, 67, 4, 1, 16}, Dims{1, 130, 4, 4, 24},
                                           Dims{2, 130, 4, 2, 64}, Dims{1, 64, 2, 2, 8},
                                           Dims{1, 200, 3, 1, 80}),
                         [](const ::testing::TestParamInfo<Dims>& info) {
                           const Dims& d = info.param;
                           return fmt::format("B{}_T{}_NH{}_NKV{}_HS{}", d.B, d.T, d.NH, d.NKV,
                                              d.HS);
                         });

// ---- gradients by central finite differences (the op registry's checker) ----

// The kernel's gradients and the reference's analytic ones, each against central differences of
// the double reference's L = Σ out ∘ dout.
TEST(Attention, BackwardMatchesCentralFiniteDifferences) {
  const Dims d{1, 5, 4, 2, 3};  // two groups of two query heads, T = 5
  Arena arena("attention_test");
  Problem pr(arena, d, DType::kF32);
  pr.forward();
  pr.backward();
  const std::vector<double> w = values_of(pr.dout);
  auto loss = [&](const optest::Buffers& in) {
    const Reference ref = naive_attention(d, in[0], in[1], in[2], nullptr);
    double sum = 0;
    for (size_t i = 0; i < w.size(); ++i) sum += ref.out[i] * w[i];
    return sum;
  };
  const optest::Buffers inputs = {values_of(pr.q), values_of(pr.k), values_of(pr.v)};
  const std::vector<std::string> names = {"q", "k", "v"};
  EXPECT_TRUE(optest::check_gradients(
      loss, inputs, {0, 1, 2}, {values_of(pr.dq), values_of(pr.dk), values_of(pr.dv)}, {}, names))
      << "kernel";
  const Reference ref = pr.reference();
  optest::GradientCheckOptions exact;
  exact.atol = 1e-8;
  exact.rtol = 1e-6;
  EXPECT_TRUE(
      optest::check_gradients(loss, inputs, {0, 1, 2}, {ref.dq, ref.dk, ref.dv}, exact, names))
      << "reference";
}

// ---- properties ----

TEST(Attention, OutputsBeforeAPositionIgnoreLaterKeysAndValues) {
  const Dims d{1, 150, 2, 1, 16};
  Arena arena("attention_test");
  Problem pr(arena, d, DType::kF32);
  pr.forward();
  const std::vector<double> before = values_of(pr.out);
  // Change keys and values from position 100 on.
  const int64_t first_changed = 100;
  float* k = pr.k.data<float>();
  float* v = pr.v.data<float>();
  for (int64_t i = first_changed * d.NKV * d.HS; i < pr.k.numel(); ++i) {
    k[i] = 3.0f - k[i];
    v[i] = 5.0f + v[i];
  }
  pr.forward();
  const std::vector<double> after = values_of(pr.out);
  const size_t unchanged = size_t(first_changed * d.NH * d.HS);
  for (size_t i = 0; i < unchanged; ++i) ASSERT_EQ(before[i], after[i]) << "element " << i;
  bool later_changed = false;
  for (size_t i = unchanged; i < after.size(); ++i) later_changed |= before[i] != after[i];
  EXPECT_TRUE(later_changed);
}

TEST(Attention, BackwardAccumulatesIntoGradients) {
  const Dims d{1, 70, 4, 2, 16};
  Arena arena("attention_test");
  Problem pr(arena, d, DType::kF32);
  pr.forward();
  pr.backward();
  const std::vector<double> dq = values_of(pr.dq), dk = values_of(pr.dk), dv = values_of(pr.dv);
  // A second call adds the same gradients again.
  pr.backward();
  auto twice = [](std::vector<double> g) {
    for (double& x : g) x *= 2;
    return g;
  };
  expect_close(pr.dq, twice(dq), 1e-6, "dq after two calls");
  expect_close(pr.dk, twice(dk), 1e-6, "dk after two calls");
  expect_close(pr.dv, twice(dv), 1e-6, "dv after two calls");
  // Non-zero starting values are kept: start from 0.5 everywhere.
  for (Tensor* g : {&pr.dq, &pr.dk, &pr.dv}) {
    std::fill(g->data<float>(), g->data<float>() + g->numel(), 0.5f);
  }
  pr.backward();
  auto plus_half = [](std::vector<double> g) {
    for (double& x : g) x += 0.5;
    return g;
  };
  expect_close(pr.dq, plus_half(dq), 1e-6, "dq from 0.5");
  expect_close(pr.dk, plus_half(dk), 1e-6, "dk from 0.5");
  expect_close(pr.dv, plus_half(dv), 1e-6, "dv from 0.5");
}

// With fewer (b, kv head) pairs than threads the backward splits into a key-tile pass and a
// query-tile pass; both paths must give the single-thread bits.
TEST(Attention, ResultsDoNotDependOnTheThreadBudget) {
  for (const Dims& d : {Dims{2, 130, 4, 2, 32}, Dims{1, 200, 4, 1, 24}}) {
    SCOPED_TRACE(describe(d));
    Arena arena("attention_test");
    Problem one(arena, d, DType::kF32), two(arena, d, DType::kF32);
    one.forward();
    one.backward();
    set_thread_budget(2);
    two.forward();
    two.backward();
    set_thread_budget(1);
    EXPECT_EQ(values_of(one.out), values_of(two.out));
    EXPECT_EQ(values_of(one.lse), values_of(two.lse));
    EXPECT_EQ(values_of(one.dq), values_of(two.dq));
    EXPECT_EQ(values_of(one.dk), values_of(two.dk));
    EXPECT_EQ(values_of(one.dv), values_of(two.dv));
  }
}

// ---- q, k and v read in place from a fused projection's output (GPT-2's c_attn) ----

// The fused projection output holding pr's q, k and v: (B·T, (NH + 2·NKV)·HS), each token's
// query heads, then its key heads, then its value heads.
Tensor fused_qkv(Arena& arena, const Problem& pr) {
  const Dims& d = pr.d;
  const size_t element = dtype_size(pr.q.dtype());
  const size_t q_bytes = size_t(d.NH * d.HS) * element, kv_bytes = size_t(d.NKV * d.HS) * element;
  Tensor qkv = Tensor::empty(arena, {d.B * d.T, (d.NH + 2 * d.NKV) * d.HS}, pr.q.dtype());
  auto* dst = static_cast<std::byte*>(qkv.raw_data());
  for (int64_t row = 0; row < d.B * d.T; ++row) {
    std::byte* out = dst + size_t(row) * (q_bytes + 2 * kv_bytes);
    std::memcpy(out, static_cast<const std::byte*>(pr.q.raw_data()) + row * q_bytes, q_bytes);
    std::memcpy(out + q_bytes, static_cast<const std::byte*>(pr.k.raw_data()) + row * kv_bytes,
                kv_bytes);
    std::memcpy(out + q_bytes + kv_bytes,
                static_cast<const std::byte*>(pr.v.raw_data()) + row * kv_bytes, kv_bytes);
  }
  return qkv;
}

// Columns [first, first + width) of every row of a 2-D tensor, as doubles.
std::vector<double> columns_of(const Tensor& t, int64_t first, int64_t width) {
  const std::vector<double> all = values_of(t);
  const int64_t row_width = t.dim(1);
  std::vector<double> out;
  for (int64_t r = 0; r < t.dim(0); ++r) {
    out.insert(out.end(), all.begin() + r * row_width + first,
               all.begin() + r * row_width + first + width);
  }
  return out;
}

// The in-place reads and the whole-gradient writes change no bit against split q, k, v and
// zeroed gradients, on one and two threads (two: the backward's two-pass path where there are
// few (b, kv head) pairs), f32 and bf16, grouped heads, several tiles and a ragged last tile.
TEST(AttentionFusedQkv, ReadsAndWritesTheBitsOfTheSplitTensors) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Dims& d : {Dims{2, 130, 4, 2, 32}, Dims{3, 64, 4, 4, 32}, Dims{1, 200, 4, 1, 24}}) {
      for (int threads : {1, 2}) {
        SCOPED_TRACE(fmt::format("{} {} threads {}", describe(d), dtype_name(dtype), threads));
        Arena arena("attention_test");
        set_thread_budget(threads);
        Problem pr(arena, d, dtype);
        Tensor dq = Tensor::zeros(arena, pr.q.shape(), dtype);
        Tensor dk = Tensor::zeros(arena, pr.k.shape(), dtype);
        Tensor dv = Tensor::zeros(arena, pr.v.shape(), dtype);
        pr.forward();
        attention_backward(dq, dk, dv, pr.dout, pr.q, pr.k, pr.v, pr.out, pr.lse);

        const Tensor qkv = fused_qkv(arena, pr);
        Tensor out = Tensor::empty(arena, pr.out.shape(), dtype);
        Tensor lse = Tensor::empty(arena, pr.lse.shape(), DType::kF32);
        attention_forward_qkv(out, lse, qkv);
        EXPECT_EQ(values_of(out), values_of(pr.out));
        EXPECT_EQ(values_of(lse), values_of(pr.lse));
        // Written whole, not added to: NaN anywhere left unwritten fails the comparison.
        Tensor dqkv = Tensor::empty(arena, qkv.shape(), dtype);
        std::vector<float> nan(size_t(dqkv.numel()), std::numeric_limits<float>::quiet_NaN());
        convert(nan.data(), DType::kF32, dqkv.raw_data(), dtype, dqkv.numel());
        attention_backward_qkv(dqkv, pr.dout, qkv, out, lse);
        set_thread_budget(1);
        const int64_t q_width = d.NH * d.HS, kv_width = d.NKV * d.HS;
        EXPECT_EQ(columns_of(dqkv, 0, q_width), values_of(dq));
        EXPECT_EQ(columns_of(dqkv, q_width, kv_width), values_of(dk));
        EXPECT_EQ(columns_of(dqkv, q_width + kv_width, kv_width), values_of(dv));
      }
    }
  }
}

// ---- key blocks (ring attention's pieces) ----

// Positions t0 .. t0 + count of a (B, T, H, HS) tensor as a tensor of their own.
Tensor positions(Arena& arena, const Tensor& t, int64_t t0, int64_t count) {
  const int64_t B = t.dim(0), T = t.dim(1), row = t.dim(2) * t.dim(3);
  Tensor out = Tensor::empty(arena, {B, count, t.dim(2), t.dim(3)}, t.dtype());
  const size_t bytes = dtype_size(t.dtype());
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(static_cast<std::byte*>(out.raw_data()) + size_t(b * count * row) * bytes,
                static_cast<const std::byte*>(t.raw_data()) + size_t((b * T + t0) * row) * bytes,
                size_t(count * row) * bytes);
  }
  return out;
}

// Values of positions t0 .. of a (B, T, H, HS) array, as `positions` cuts them.
std::vector<double> positions_of(const std::vector<double>& all, const Tensor& shape, int64_t t0,
                                 int64_t count) {
  const int64_t B = shape.dim(0), T = shape.dim(1), row = shape.dim(2) * shape.dim(3);
  std::vector<double> out;
  for (int64_t b = 0; b < B; ++b) {
    out.insert(out.end(), all.begin() + (b * T + t0) * row,
               all.begin() + (b * T + t0 + count) * row);
  }
  return out;
}

// A sequence cut into chunks, each chunk's queries against every chunk at or before it (the
// diagonal causal, shift 0; earlier ones whole, shift ≥ their length), merged by log-sum-exp and
// differentiated block by block with the merged out and lse: the whole causal attention.
TEST(AttentionBlocks, ChunksAgainstEarlierChunksMergeIntoTheCausalAttention) {
  const Dims d{2, 200, 4, 2, 24};
  const std::vector<int64_t> starts = {0, 70, 140, 200};  // chunks across tile boundaries
  Arena arena("attention_test");
  Problem pr(arena, d, DType::kF32);
  const Reference ref = pr.reference();
  const int64_t HS = d.HS;
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    const int64_t q0 = starts[i], count = starts[i + 1] - q0;
    SCOPED_TRACE(fmt::format("query chunk {}..{}", q0, q0 + count));
    const Tensor q = positions(arena, pr.q, q0, count);
    Tensor out = Tensor::zeros(arena, {d.B, count, d.NH, HS}, DType::kF32);
    Tensor lse = Tensor::empty(arena, {d.B, d.NH, count}, DType::kF32);
    std::fill(lse.data<float>(), lse.data<float>() + lse.numel(), -INFINITY);
    Tensor block_out = Tensor::empty(arena, out.shape(), DType::kF32);
    Tensor block_lse = Tensor::empty(arena, lse.shape(), DType::kF32);
    for (size_t j = 0; j <= i; ++j) {
      const int64_t k0 = starts[j], keys = starts[j + 1] - k0;
      attention_forward(block_out, block_lse, q, positions(arena, pr.k, k0, keys),
                        positions(arena, pr.v, k0, keys), q0 - k0);
      attention_merge(out, lse, block_out, block_lse);
    }
    expect_close(out, positions_of(ref.out, pr.q, q0, count), 2e-6, "out");
    std::vector<double> ref_lse;
    for (int64_t bh = 0; bh < d.B * d.NH; ++bh) {
      ref_lse.insert(ref_lse.end(), ref.lse.begin() + bh * d.T + q0,
                     ref.lse.begin() + bh * d.T + q0 + count);
    }
    expect_close(lse, ref_lse, 2e-6, "lse");
    // dq of the chunk sums its blocks; each block's dk, dv are that chunk's share.
    const Tensor dout = positions(arena, pr.dout, q0, count);
    Tensor dq = Tensor::zeros(arena, q.shape(), DType::kF32);
    for (size_t j = 0; j <= i; ++j) {
      const int64_t k0 = starts[j], keys = starts[j + 1] - k0;
      Tensor dk = Tensor::zeros(arena, {d.B, keys, d.NKV, HS}, DType::kF32);
      Tensor dv = Tensor::zeros(arena, dk.shape(), DType::kF32);
      attention_backward(dq, dk, dv, dout, q, positions(arena, pr.k, k0, keys),
                         positions(arena, pr.v, k0, keys), out, lse, q0 - k0);
      float* gk = pr.dk.data<float>();
      float* gv = pr.dv.data<float>();
      const int64_t row = d.NKV * HS;
      for (int64_t b = 0; b < d.B; ++b) {
        for (int64_t e = 0; e < keys * row; ++e) {
          gk[(b * d.T + k0) * row + e] += dk.data<float>()[b * keys * row + e];
          gv[(b * d.T + k0) * row + e] += dv.data<float>()[b * keys * row + e];
        }
      }
    }
    expect_close(dq, positions_of(ref.dq, pr.q, q0, count), 1e-5, "dq");
  }
  expect_close(pr.dk, ref.dk, 1e-5, "dk summed over the query chunks");
  expect_close(pr.dv, ref.dv, 1e-5, "dv summed over the query chunks");
}

// Queries 100 .. 199 against keys 0 .. 199 (shift 100, a mask that cuts the block): the rows of
// the whole causal attention, and with dout zero before 100 its gradients.
TEST(AttentionBlocks, AShiftedBlockSeesTheKeysUpToEachQuerysPosition) {
  const Dims d{1, 200, 4, 1, 16};
  Arena arena("attention_test");
  Problem pr(arena, d, DType::kF32);
  std::fill(pr.dout.data<float>(), pr.dout.data<float>() + 100 * d.NH * d.HS, 0.0f);
  const Reference ref = pr.reference();
  const int64_t first = 100, count = 100;
  const Tensor q = positions(arena, pr.q, first, count);
  Tensor out = Tensor::empty(arena, q.shape(), DType::kF32);
  Tensor lse = Tensor::empty(arena, {d.B, d.NH, count}, DType::kF32);
  attention_forward(out, lse, q, pr.k, pr.v, first);
  expect_close(out, positions_of(ref.out, pr.q, first, count), 2e-6, "out");
  Tensor dq = Tensor::zeros(arena, q.shape(), DType::kF32);
  attention_backward(dq, pr.dk, pr.dv, positions(arena, pr.dout, first, count), q, pr.k, pr.v, out,
                     lse, first);
  expect_close(dq, positions_of(ref.dq, pr.q, first, count), 1e-5, "dq");
  expect_close(pr.dk, ref.dk, 1e-5, "dk");
  expect_close(pr.dv, ref.dv, 1e-5, "dv");
  // Two threads for one (b, kv head) pair take the split passes: the same bits.
  Tensor dq2 = Tensor::zeros(arena, q.shape(), DType::kF32);
  Tensor dk2 = Tensor::zeros(arena, pr.k.shape(), DType::kF32);
  Tensor dv2 = Tensor::zeros(arena, pr.v.shape(), DType::kF32);
  Tensor dk1 = Tensor::zeros(arena, pr.k.shape(), DType::kF32);
  Tensor dv1 = Tensor::zeros(arena, pr.v.shape(), DType::kF32);
  Tensor dq1 = Tensor::zeros(arena, q.shape(), DType::kF32);
  const Tensor dout = positions(arena, pr.dout, first, count);
  attention_backward(dq1, dk1, dv1, dout, q, pr.k, pr.v, out, lse, first);
  set_thread_budget(2);
  attention_backward(dq2, dk2, dv2, dout, q, pr.k, pr.v, out, lse, first);
  set_thread_budget(1);
  EXPECT_EQ(values_of(dq1), values_of(dq2));
  EXPECT_EQ(values_of(dk1), values_of(dk2));
  EXPECT_EQ(values_of(dv1), values_of(dv2));
}

// ---- bf16 ----

// bf16 inputs are the same values to both runs and arithmetic is fp32, so bf16 results differ
// from fp32 ones only by rounding: out to bf16 (≤ 2^-9 relative), D = rowsum(dO ∘ O) computed
// from that rounded out, and each gradient rounded once to bf16. Tolerance: 1% of the largest
// magnitude for out and the gradients; lse, saved in f32, within 1e-5.
TEST(Attention, Bf16MatchesFp32OnTheSameValuesWithinRounding) {
  const Dims d{2, 130, 4, 2, 64};
  Arena arena("attention_test");
  Problem bf(arena, d, DType::kBF16);
  bf.dq = Tensor::zeros(arena, bf.q.shape(), DType::kBF16);
  bf.dk = Tensor::zeros(arena, bf.k.shape(), DType::kBF16);
  bf.dv = Tensor::zeros(arena, bf.v.shape(), DType::kBF16);
  Problem fp(arena, d, DType::kF32);
  fp.q.copy_from(bf.q);
  fp.k.copy_from(bf.k);
  fp.v.copy_from(bf.v);
  fp.dout.copy_from(bf.dout);
  bf.forward();
  bf.backward();
  fp.forward();
  fp.backward();
  expect_close(bf.out, values_of(fp.out), 1e-2, "out");
  expect_close(bf.lse, values_of(fp.lse), 1e-5, "lse");
  expect_close(bf.dq, values_of(fp.dq), 1e-2, "dq");
  expect_close(bf.dk, values_of(fp.dk), 1e-2, "dk");
  expect_close(bf.dv, values_of(fp.dv), 1e-2, "dv");
  // f32 gradients of bf16 inputs skip the last rounding; what remains against the exact
  // reference is D computed from the bf16 out (FlashAttention-2 uses the stored out).
  Problem mixed(arena, d, DType::kBF16);
  mixed.forward();
  mixed.backward();
  const Reference ref = mixed.reference();
  expect_close(mixed.out, ref.out, 1e-2, "bf16 out");
  expect_close(mixed.lse, ref.lse, 1e-5, "lse of bf16 inputs");
  expect_close(mixed.dq, ref.dq, 1e-2, "f32 dq of bf16 inputs");
  expect_close(mixed.dk, ref.dk, 1e-2, "f32 dk of bf16 inputs");
  expect_close(mixed.dv, ref.dv, 1e-2, "f32 dv of bf16 inputs");
}

// ---- bad input ----

template <class Error, class F>
void expect_error(F&& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "expected an error mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Attention, BadInputRaisesErrorsNamingTheArgument) {
  Arena arena("attention_test");
  const Dims d{1, 8, 4, 2, 16};
  Problem pr(arena, d, DType::kF32);
  Tensor k3 = Tensor::zeros(arena, {1, 8, 3, 16}, DType::kF32);
  expect_error<ShapeError>([&] { attention_forward(pr.out, pr.lse, pr.q, k3, k3); },
                           "not a multiple of NKV = 3");
  Tensor k_hs = Tensor::zeros(arena, {1, 8, 2, 8}, DType::kF32);
  expect_error<ShapeError>([&] { attention_forward(pr.out, pr.lse, pr.q, k_hs, k_hs); }, "'k'");
  Tensor k_bf16 = Tensor::zeros(arena, pr.k.shape(), DType::kBF16);
  expect_error<DTypeError>([&] { attention_forward(pr.out, pr.lse, pr.q, k_bf16, pr.v); }, "'k'");
  Tensor lse_bf16 = Tensor::zeros(arena, pr.lse.shape(), DType::kBF16);
  expect_error<DTypeError>([&] { attention_forward(pr.out, lse_bf16, pr.q, pr.k, pr.v); }, "'lse'");
  Tensor lse_short = Tensor::zeros(arena, {1, 4, 7}, DType::kF32);
  expect_error<ShapeError>([&] { attention_forward(pr.out, lse_short, pr.q, pr.k, pr.v); },
                           "'lse'");
  Tensor q_int = Tensor::zeros(arena, pr.q.shape(), DType::kI32);
  expect_error<DTypeError>([&] { attention_forward(pr.out, pr.lse, q_int, pr.k, pr.v); }, "'q'");
  Tensor undefined;
  expect_error<ValueError>([&] { attention_forward(pr.out, pr.lse, pr.q, pr.k, undefined); },
                           "'v'");
  expect_error<ValueError>([&] { attention_forward(undefined, pr.lse, pr.q, pr.k, pr.v); },
                           "attention_forward: 'out'");

  pr.forward();
  Tensor dk_bf16 = Tensor::zeros(arena, pr.k.shape(), DType::kBF16);
  expect_error<DTypeError>(
      [&] { attention_backward(pr.dq, dk_bf16, pr.dv, pr.dout, pr.q, pr.k, pr.v, pr.out, pr.lse); },
      "attention_backward: 'dk'");
  Tensor dq_short = Tensor::zeros(arena, {1, 7, 4, 16}, DType::kF32);
  expect_error<ShapeError>(
      [&] {
        attention_backward(dq_short, pr.dk, pr.dv, pr.dout, pr.q, pr.k, pr.v, pr.out, pr.lse);
      },
      "'dq'");
  expect_error<ValueError>(
      [&] { attention_backward(pr.dq, pr.dk, pr.dv, undefined, pr.q, pr.k, pr.v, pr.out, pr.lse); },
      "'dout'");
  // Nothing was written by the refused calls.
  EXPECT_EQ(values_of(pr.dq), std::vector<double>(size_t(pr.dq.numel()), 0.0));
}

TEST(AttentionBlocks, KeysStartingAfterTheQueriesAreRefused) {
  Arena arena("attention_test");
  Problem pr(arena, {1, 8, 2, 1, 16}, DType::kF32);
  expect_error<ValueError>([&] { attention_forward(pr.out, pr.lse, pr.q, pr.k, pr.v, -4); },
                           "start 4 positions before their keys");
}

TEST(AttentionFusedQkv, AProjectionOfTheWrongWidthOrAGradientOfAnotherDtypeIsRefused) {
  Arena arena("attention_test");
  const Dims d{1, 8, 4, 2, 16};
  Problem pr(arena, d, DType::kBF16);
  Tensor qkv = fused_qkv(arena, pr);
  Tensor narrow = Tensor::zeros(arena, {8, 4 * 16 + 16}, DType::kBF16);
  expect_error<ShapeError>([&] { attention_forward_qkv(pr.out, pr.lse, narrow); },
                           "attention_forward_qkv: 'qkv' has shape");
  Tensor short_rows = Tensor::zeros(arena, {7, (4 + 4) * 16}, DType::kBF16);
  expect_error<ShapeError>([&] { attention_forward_qkv(pr.out, pr.lse, short_rows); }, "8 rows");
  attention_forward_qkv(pr.out, pr.lse, qkv);
  Tensor dqkv_i32 = Tensor::zeros(arena, qkv.shape(), DType::kI32);
  expect_error<DTypeError>([&] { attention_backward_qkv(dqkv_i32, pr.dout, qkv, pr.out, pr.lse); },
                           "'dqkv'");
  Tensor dqkv_wide = Tensor::zeros(arena, {8, (4 + 6) * 16}, DType::kF32);
  expect_error<ShapeError>([&] { attention_backward_qkv(dqkv_wide, pr.dout, qkv, pr.out, pr.lse); },
                           "'dqkv'");
  Tensor same = qkv;
  expect_error<ValueError>([&] { attention_backward_qkv(same, pr.dout, qkv, pr.out, pr.lse); },
                           "'dqkv' is 'qkv' itself");
}

}  // namespace
}  // namespace lattice
