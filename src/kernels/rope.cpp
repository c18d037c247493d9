// Rotary position embedding, HF Llama "rotate_half" layout: within each head, dimension i of
// the first half and dimension i + HS/2 form a pair rotated by angle p·theta^(-2i/HS) at
// position p. Backward is the inverse rotation (angle negated), since the map is orthogonal.
#include "kernels/rope.h"

#include <cmath>
#include <vector>

#include "kernels/kernel_support.h"

namespace lattice {

using kernel::Elem;
using kernel::load;
using kernel::store_as;
using kernel::visit_floats;

namespace {

// Pairs rotated per step through a local buffer, which makes out == inp safe and vectorisable.
constexpr int64_t kPairChunk = 64;

// cos and sin of every (position, pair) angle, (T, HS/2) each. Angles are formed and evaluated
// in double (position · frequency loses digits in fp32 at long contexts) and rounded once.
// A training step calls RoPE with the same arguments in every layer, so the calling thread
// keeps the last table.
struct RotaryTable {
  float theta = 0.0f;
  int64_t head_size = 0;
  int64_t position_offset = 0;
  int64_t seq = 0;
  std::vector<float> cos;
  std::vector<float> sin;
};

const RotaryTable& rotary_table(float theta, int64_t head_size, int64_t position_offset,
                                int64_t seq) {
  thread_local RotaryTable table;
  if (table.theta == theta && table.head_size == head_size &&
      table.position_offset == position_offset && table.seq == seq) {
    return table;
  }
  const int64_t half = head_size / 2;
  table.cos.resize(size_t(seq * half));
  table.sin.resize(size_t(seq * half));
  std::vector<double> frequency(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    frequency[i] = std::pow(double(theta), -2.0 * double(i) / double(head_size));
  }
  float* pcos = table.cos.data();
  float* psin = table.sin.data();
  LATTICE_PARALLEL_FOR(seq * half * 16)
  for (int64_t t = 0; t < seq; ++t) {
    const double position = double(position_offset + t);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = position * frequency[size_t(i)];
      pcos[t * half + i] = float(std::cos(angle));
      psin[t * half + i] = float(std::sin(angle));
    }
  }
  table.theta = theta;
  table.head_size = head_size;
  table.position_offset = position_offset;
  table.seq = seq;
  return table;
}

// dst = rotation of src by the angles (cos, sin·direction), per head of one (b, t) row;
// accumulate adds into dst instead of writing.
template <class Src, class Dst>
void rotate_row(Dst* dst, const Src* src, const float* cos, const float* sin, float direction,
                int64_t heads, int64_t head_size, bool accumulate) {
  const int64_t half = head_size / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const Src* x = src + h * head_size;
    Dst* y = dst + h * head_size;
    for (int64_t i0 = 0; i0 < half; i0 += kPairChunk) {
      const int64_t count = std::min(kPairChunk, half - i0);
      float first[kPairChunk];
      float second[kPairChunk];
      for (int64_t i = 0; i < count; ++i) {
        first[i] = load(x[i0 + i]);
        second[i] = load(x[half + i0 + i]);
      }
      for (int64_t i = 0; i < count; ++i) {
        const float c = cos[i0 + i];
        const float s = direction * sin[i0 + i];
        float a = first[i] * c - second[i] * s;
        float b = second[i] * c + first[i] * s;
        if (accumulate) {
          a += load(y[i0 + i]);
          b += load(y[half + i0 + i]);
        }
        y[i0 + i] = store_as<Dst>(a);
        y[half + i0 + i] = store_as<Dst>(b);
      }
    }
  }
}

void rope_apply(std::string_view op, std::string_view dst_name, std::string_view src_name,
                Tensor& dst, const Tensor& src, float theta, int64_t position_offset,
                float direction, bool accumulate) {
  expect_float_dtype(dst, op, dst_name);
  expect_float_dtype(src, op, src_name);
  expect_rank(src, 4, op, src_name);
  expect_same_shape(dst, src, op, dst_name, src_name);
  const int64_t batch = src.dim(0);
  const int64_t seq = src.dim(1);
  const int64_t heads = src.dim(2);
  const int64_t head_size = src.dim(3);
  if (head_size % 2 != 0) {
    LATTICE_THROW(ShapeError, "{}: head size HS = {} of '{}' {} must be even (rotate_half pairs)",
                  op, head_size, src_name, src.shape().to_string());
  }
  if (!(theta > 0.0f)) LATTICE_THROW(ValueError, "{}: theta must be > 0, got {}", op, theta);
  if (position_offset < 0) {
    LATTICE_THROW(ValueError, "{}: position_offset must be >= 0, got {}", op, position_offset);
  }
  if (src.numel() == 0) return;
  const RotaryTable& table = rotary_table(theta, head_size, position_offset, seq);
  const float* pcos = table.cos.data();
  const float* psin = table.sin.data();
  const int64_t half = head_size / 2;
  const int64_t row = heads * head_size;
  visit_floats(
      [&](auto* d, auto* s) {
        LATTICE_PARALLEL_FOR(batch * seq * row)
        for (int64_t bt = 0; bt < batch * seq; ++bt) {
          const int64_t t = bt % seq;
          rotate_row(d + bt * row, s + bt * row, pcos + t * half, psin + t * half, direction, heads,
                     head_size, accumulate);
        }
      },
      dst, src);
}

}  // namespace

void rope_forward(Tensor& out, const Tensor& inp, float theta, int64_t position_offset) {
  const KernelTimer timer("rope fwd", 0, kernel::bytes_of({&out, &inp}));
  rope_apply("rope_forward", "out", "inp", out, inp, theta, position_offset, 1.0f,
             /*accumulate=*/false);
}

void rope_backward(Tensor& dinp, const Tensor& dout, float theta, int64_t position_offset) {
  const KernelTimer timer("rope bwd", 0, kernel::bytes_of({&dinp, &dout}));
  rope_apply("rope_backward", "dinp", "dout", dinp, dout, theta, position_offset, -1.0f,
             /*accumulate=*/true);
}

}  // namespace lattice
