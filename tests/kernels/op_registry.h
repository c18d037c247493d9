// The kernels' op-test registry (ggml's test-backend-ops style).
//
// Each op is an OpCase: its inputs and outputs, the kernel's forward and backward as plain
// calls, a naive double-precision reference of the forward, and tolerances. ops_test.cpp runs
// every registered case in four modes:
//   forward   the kernel (f32) against the double reference;
//   gradient  the kernel's backward (f32) against central finite differences of the double
//             reference's loss L = Σ dout·out (check_gradients, reusable on its own);
//   bf16      the same inputs rounded to bf16, run once with f32 tensors and once with bf16
//             tensors: every bf16 result must be the f32 result rounded once (see
//             kBf16Rtol for why that is the bound);
//   accumulate  backward called twice gives twice the gradient (README: backward +=).
// The <op>_test.cpp files register their cases with register_op_case and hold the tests that
// do not fit the mould (errors, ignore index, aliasing, hand-computed optimizer steps).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace lattice::optest {

using Buffer = std::vector<double>;
using Buffers = std::vector<Buffer>;

// ---- values <-> tensors ----

// A tensor of `dtype` (any float dtype or i32) holding `values` (rounded to the dtype).
Tensor make_tensor(Arena& arena, const Shape& shape, DType dtype, const Buffer& values);
Buffer to_buffer(const Tensor& t);
Buffer round_to_bf16(const Buffer& values);

// |actual - expected| <= atol + rtol·|expected| for every element, else a message naming the
// worst element of `what`.
::testing::AssertionResult buffers_near(const Buffer& actual, const Buffer& expected, double atol,
                                        double rtol, const std::string& what);

// ---- the generic gradient checker ----

struct GradientCheckOptions {
  double step = 1e-4;  // central-difference step, relative to max(1, |x|)
  double atol = 1e-5;  // |analytic - numeric| <= atol + rtol·|numeric|
  double rtol = 1e-4;
};

// Central differences (L(x + h) - L(x - h)) / 2h of the scalar `loss`, evaluated in double on
// `inputs`, for every element of the inputs listed in `wrt`; compared with `analytic`, where
// analytic[k] is the kernel's gradient with respect to inputs[wrt[k]]. `names` (optional, one
// per input) label the message. The loss is any double function of all input buffers, so
// kernels outside this registry (attention) can use the checker with their own reference.
::testing::AssertionResult check_gradients(const std::function<double(const Buffers&)>& loss,
                                           const Buffers& inputs, const std::vector<size_t>& wrt,
                                           const Buffers& analytic,
                                           const GradientCheckOptions& options = {},
                                           const std::vector<std::string>& names = {});

// ---- op cases ----

enum class Role {
  kActivation,  // value and gradient in the mode dtype (f32, or bf16 in bf16 mode)
  kParameter,   // value in the mode dtype, gradient always f32 (dweight, dtable)
  kF32,         // always f32; as an output it is part of the loss (per-token losses)
  kStatistic,   // f32 output saved for backward (mean, rstd): compared, not in the loss
  kIndex,       // i32 input (token ids, targets), never differentiated
};

struct ArgSpec {
  ArgSpec(std::string name, Shape shape, Role role = Role::kActivation, double low = -2.0,
          double high = 2.0, bool differentiable = true)
      : name(std::move(name)),
        shape(std::move(shape)),
        role(role),
        low(low),
        high(high),
        differentiable(differentiable) {}
  // A kIndex input holding exactly `values`.
  static ArgSpec index(std::string name, Shape shape, std::vector<int32_t> values) {
    ArgSpec a(std::move(name), std::move(shape), Role::kIndex);
    a.differentiable = false;
    a.indices = std::move(values);
    return a;
  }

  std::string name;
  Shape shape;
  Role role;
  double low;  // random values uniform in [low, high)
  double high;
  bool differentiable;           // the backward produces a gradient for it
  std::vector<int32_t> indices;  // kIndex only
};

struct OutSpec {
  OutSpec(std::string name, Shape shape, Role role = Role::kActivation)
      : name(std::move(name)), shape(std::move(shape)), role(role) {}

  std::string name;
  Shape shape;
  Role role;
};

struct Tolerance {
  double forward_atol = 1e-6;  // f32 kernel vs double reference
  double forward_rtol = 1e-5;
  double grad_atol = 1e-5;  // f32 backward vs central differences
  double grad_rtol = 1e-4;
};

// bf16 results must equal the f32 results (same bf16-exact inputs) rounded once: kernels
// compute in fp32 either way and round only the stored result, and round-to-nearest-even is
// within half a bf16 ulp (2^-9 relative). The bound allows one ulp (2^-8) so a value next to a
// power of two, where the ulp halves, still passes; the tiny atol covers exact zeros.
inline constexpr double kBf16Rtol = 1.0 / 256.0;
inline constexpr double kBf16Atol = 1e-30;

using TensorList = std::vector<Tensor>;

struct OpCase {
  std::string name;  // [A-Za-z0-9_] only: it becomes part of a test name
  std::vector<ArgSpec> inputs;
  std::vector<OutSpec> outputs;
  // Writes every output (the harness zeroes them first).
  std::function<void(const TensorList& in, TensorList& out)> forward;
  // The double-precision reference: one buffer per output, same order and layout.
  std::function<Buffers(const Buffers& in)> reference;
  // Optional. Adds (or, for !backward_accumulates, writes) into grads, one tensor per
  // differentiable input in input order; dout holds one gradient per output.
  std::function<void(const TensorList& in, const TensorList& out, const TensorList& dout,
                     TensorList& grads)>
      backward;
  bool backward_accumulates = true;
  // When the backward takes a scalar scale instead of a dout tensor (cross-entropy), every
  // dout element is this value.
  std::optional<double> uniform_dout;
  Tolerance tolerance;
};

// Registers a case for ops_test.cpp; returns true so it can initialise a namespace-scope
// constant. Names must be unique.
bool register_op_case(OpCase op_case);
const std::vector<OpCase>& op_cases();
const OpCase& find_op_case(const std::string& name);

// ---- running a case ----

// Random inputs from a seed derived from the case name; float values are exactly
// representable in f32 (and, with bf16_exact, in bf16).
Buffers make_inputs(const OpCase& op_case, bool bf16_exact);
// One dout buffer per output (zeros for statistics; uniform_dout when set).
Buffers make_douts(const OpCase& op_case, bool bf16_exact);

struct CaseResult {
  Buffers outputs;
  Buffers grads;  // one per differentiable input (empty without backward)
};

// Runs forward, then `backward_calls` times backward into zeroed gradients, with tensors of
// `mode` (kF32 or kBF16) for the mode-dtype roles.
CaseResult run_case(const OpCase& op_case, const Buffers& inputs, const Buffers& douts, DType mode,
                    int backward_calls);

// The scalar L = Σ over outputs in the loss of dout·reference(inputs), in double.
double reference_loss(const OpCase& op_case, const Buffers& inputs, const Buffers& douts);

// Indices of the differentiable inputs, in input order.
std::vector<size_t> differentiable_inputs(const OpCase& op_case);

}  // namespace lattice::optest
