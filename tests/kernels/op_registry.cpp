#include "op_registry.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/philox.h"

namespace lattice::optest {

namespace {

std::vector<OpCase>& registry() {
  static std::vector<OpCase> cases;
  return cases;
}

// Mode dtype for values and for gradients of an argument with `role`.
DType value_dtype(Role role, DType mode) {
  switch (role) {
    case Role::kActivation:
    case Role::kParameter:
      return mode;
    case Role::kF32:
    case Role::kStatistic:
      return DType::kF32;
    case Role::kIndex:
      return DType::kI32;
  }
  return DType::kF32;
}

DType grad_dtype(Role role, DType mode) {
  return role == Role::kActivation ? mode : DType::kF32;
}

bool in_loss(Role role) {
  return role == Role::kActivation || role == Role::kParameter || role == Role::kF32;
}

bool rounds_in_bf16_mode(Role role) {
  return role == Role::kActivation || role == Role::kParameter;
}

}  // namespace

Tensor make_tensor(Arena& arena, const Shape& shape, DType dtype, const Buffer& values) {
  LATTICE_CHECK_EQ(int64_t(values.size()), shape.numel(), "values for a {} tensor",
                   shape.to_string());
  Tensor t = Tensor::empty(arena, shape, dtype);
  if (dtype == DType::kI32) {
    int32_t* p = t.data<int32_t>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = int32_t(values[i]);
    return t;
  }
  std::vector<float> f(values.begin(), values.end());
  convert(f.data(), DType::kF32, t.raw_data(), dtype, t.numel());
  return t;
}

Buffer to_buffer(const Tensor& t) {
  if (t.dtype() == DType::kI32) {
    const int32_t* p = t.data<int32_t>();
    return Buffer(p, p + t.numel());
  }
  std::vector<float> f(size_t(t.numel()));
  convert(t.raw_data(), t.dtype(), f.data(), DType::kF32, t.numel());
  return Buffer(f.begin(), f.end());
}

Buffer round_to_bf16(const Buffer& values) {
  Buffer out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = double(float(bf16(float(values[i]))));
  return out;
}

::testing::AssertionResult buffers_near(const Buffer& actual, const Buffer& expected, double atol,
                                        double rtol, const std::string& what) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << actual.size() << " values, expected " << expected.size();
  }
  size_t worst = 0;
  double worst_excess = 0.0;
  size_t failures = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double bound = atol + rtol * std::abs(expected[i]);
    const double error = std::abs(actual[i] - expected[i]);
    // !(error <= bound) also catches NaN.
    if (!(error <= bound)) {
      ++failures;
      const double excess = std::isnan(error) ? INFINITY : error / bound;
      if (failures == 1 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << failures << " of " << actual.size() << " elements outside atol=" << atol
         << " rtol=" << rtol << "; worst [" << worst << "]: got " << actual[worst] << ", expected "
         << expected[worst];
}

::testing::AssertionResult check_gradients(const std::function<double(const Buffers&)>& loss,
                                           const Buffers& inputs, const std::vector<size_t>& wrt,
                                           const Buffers& analytic,
                                           const GradientCheckOptions& options,
                                           const std::vector<std::string>& names) {
  if (analytic.size() != wrt.size()) {
    return ::testing::AssertionFailure()
           << analytic.size() << " analytic gradients for " << wrt.size() << " inputs";
  }
  Buffers x = inputs;
  for (size_t k = 0; k < wrt.size(); ++k) {
    const size_t which = wrt[k];
    const std::string name = which < names.size() ? names[which] : "input " + std::to_string(which);
    Buffer numeric(x[which].size());
    for (size_t i = 0; i < x[which].size(); ++i) {
      const double original = x[which][i];
      const double h = options.step * std::max(1.0, std::abs(original));
      x[which][i] = original + h;
      const double plus = loss(x);
      x[which][i] = original - h;
      const double minus = loss(x);
      x[which][i] = original;
      numeric[i] = (plus - minus) / (2.0 * h);
    }
    auto result = buffers_near(analytic[k], numeric, options.atol, options.rtol,
                               "gradient of '" + name + "' vs central differences");
    if (!result) return result;
  }
  return ::testing::AssertionSuccess();
}

bool register_op_case(OpCase op_case) {
  for (const OpCase& existing : registry()) {
    LATTICE_CHECK(existing.name != op_case.name, "op case '{}' registered twice", op_case.name);
  }
  registry().push_back(std::move(op_case));
  return true;
}

const std::vector<OpCase>& op_cases() {
  return registry();
}

const OpCase& find_op_case(const std::string& name) {
  for (const OpCase& c : registry()) {
    if (c.name == name) return c;
  }
  LATTICE_THROW(ValueError, "no op case named '{}'", name);
}

Buffers make_inputs(const OpCase& op_case, bool bf16_exact) {
  std::mt19937_64 rng(hash_name(op_case.name));
  Buffers inputs;
  for (const ArgSpec& arg : op_case.inputs) {
    if (arg.role == Role::kIndex) {
      LATTICE_CHECK_EQ(int64_t(arg.indices.size()), arg.shape.numel(), "indices of '{}'", arg.name);
      inputs.emplace_back(arg.indices.begin(), arg.indices.end());
      continue;
    }
    std::uniform_real_distribution<double> dist(arg.low, arg.high);
    Buffer values(size_t(arg.shape.numel()));
    for (double& v : values) v = double(float(dist(rng)));
    if (bf16_exact && rounds_in_bf16_mode(arg.role)) values = round_to_bf16(values);
    inputs.push_back(std::move(values));
  }
  return inputs;
}

Buffers make_douts(const OpCase& op_case, bool bf16_exact) {
  std::mt19937_64 rng(hash_name(op_case.name + "/dout"));
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  Buffers douts;
  for (const OutSpec& out : op_case.outputs) {
    Buffer values(size_t(out.shape.numel()), 0.0);
    if (in_loss(out.role)) {
      for (double& v : values) {
        v = op_case.uniform_dout ? *op_case.uniform_dout : double(float(dist(rng)));
      }
      if (bf16_exact && rounds_in_bf16_mode(out.role)) values = round_to_bf16(values);
    }
    douts.push_back(std::move(values));
  }
  return douts;
}

std::vector<size_t> differentiable_inputs(const OpCase& op_case) {
  std::vector<size_t> wrt;
  for (size_t i = 0; i < op_case.inputs.size(); ++i) {
    const ArgSpec& arg = op_case.inputs[i];
    if (arg.differentiable && arg.role != Role::kIndex && arg.role != Role::kStatistic) {
      wrt.push_back(i);
    }
  }
  return wrt;
}

CaseResult run_case(const OpCase& op_case, const Buffers& inputs, const Buffers& douts, DType mode,
                    int backward_calls) {
  Arena arena("op_test");
  TensorList in;
  for (size_t i = 0; i < op_case.inputs.size(); ++i) {
    const ArgSpec& arg = op_case.inputs[i];
    in.push_back(make_tensor(arena, arg.shape, value_dtype(arg.role, mode), inputs[i]));
  }
  TensorList out;
  for (const OutSpec& spec : op_case.outputs) {
    out.push_back(Tensor::zeros(arena, spec.shape, value_dtype(spec.role, mode)));
  }
  op_case.forward(in, out);
  CaseResult result;
  for (const Tensor& t : out) result.outputs.push_back(to_buffer(t));
  if (!op_case.backward || backward_calls == 0) return result;

  TensorList dout;
  for (size_t o = 0; o < op_case.outputs.size(); ++o) {
    const OutSpec& spec = op_case.outputs[o];
    dout.push_back(make_tensor(arena, spec.shape, value_dtype(spec.role, mode), douts[o]));
  }
  TensorList grads;
  for (size_t i : differentiable_inputs(op_case)) {
    const ArgSpec& arg = op_case.inputs[i];
    grads.push_back(Tensor::zeros(arena, arg.shape, grad_dtype(arg.role, mode)));
  }
  for (int call = 0; call < backward_calls; ++call) op_case.backward(in, out, dout, grads);
  for (const Tensor& g : grads) result.grads.push_back(to_buffer(g));
  return result;
}

double reference_loss(const OpCase& op_case, const Buffers& inputs, const Buffers& douts) {
  const Buffers outputs = op_case.reference(inputs);
  double loss = 0.0;
  for (size_t o = 0; o < op_case.outputs.size(); ++o) {
    if (!in_loss(op_case.outputs[o].role)) continue;
    for (size_t i = 0; i < outputs[o].size(); ++i) loss += douts[o][i] * outputs[o][i];
  }
  return loss;
}

}  // namespace lattice::optest
