// Runs every registered op case (op_registry.h) in forward, gradient, bf16 and accumulate
// modes. The cases themselves live in the <op>_test.cpp files.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "op_registry.h"

namespace lattice::optest {
namespace {

std::vector<std::string> case_names(bool with_backward) {
  std::vector<std::string> names;
  for (const OpCase& c : op_cases()) {
    if (!with_backward || c.backward) names.push_back(c.name);
  }
  return names;
}

std::string output_label(const OpCase& c, size_t o, const char* mode) {
  return c.name + " " + mode + " output '" + c.outputs[o].name + "'";
}

std::string grad_label(const OpCase& c, size_t input, const char* mode) {
  return c.name + " " + mode + " gradient of '" + c.inputs[input].name + "'";
}

std::vector<std::string> input_names(const OpCase& c) {
  std::vector<std::string> names;
  for (const ArgSpec& a : c.inputs) names.push_back(c.name + "/" + a.name);
  return names;
}

class OpForward : public ::testing::TestWithParam<std::string> {};
class OpBackward : public ::testing::TestWithParam<std::string> {};

TEST_P(OpForward, F32MatchesDoubleReference) {
  const OpCase& c = find_op_case(GetParam());
  const Buffers inputs = make_inputs(c, /*bf16_exact=*/false);
  const Buffers expected = c.reference(inputs);
  const CaseResult got = run_case(c, inputs, {}, DType::kF32, /*backward_calls=*/0);
  ASSERT_EQ(got.outputs.size(), expected.size());
  for (size_t o = 0; o < expected.size(); ++o) {
    EXPECT_TRUE(buffers_near(got.outputs[o], expected[o], c.tolerance.forward_atol,
                             c.tolerance.forward_rtol, output_label(c, o, "f32")));
  }
}

TEST_P(OpForward, Bf16IsF32RoundedOnce) {
  const OpCase& c = find_op_case(GetParam());
  const Buffers inputs = make_inputs(c, /*bf16_exact=*/true);
  const CaseResult f32 = run_case(c, inputs, {}, DType::kF32, 0);
  const CaseResult bf16 = run_case(c, inputs, {}, DType::kBF16, 0);
  for (size_t o = 0; o < f32.outputs.size(); ++o) {
    EXPECT_TRUE(buffers_near(bf16.outputs[o], f32.outputs[o], kBf16Atol, kBf16Rtol,
                             output_label(c, o, "bf16")));
  }
}

TEST_P(OpBackward, F32MatchesCentralDifferences) {
  const OpCase& c = find_op_case(GetParam());
  const Buffers inputs = make_inputs(c, false);
  const Buffers douts = make_douts(c, false);
  const CaseResult got = run_case(c, inputs, douts, DType::kF32, /*backward_calls=*/1);
  GradientCheckOptions options;
  options.atol = c.tolerance.grad_atol;
  options.rtol = c.tolerance.grad_rtol;
  auto loss = [&](const Buffers& x) { return reference_loss(c, x, douts); };
  EXPECT_TRUE(
      check_gradients(loss, inputs, differentiable_inputs(c), got.grads, options, input_names(c)));
}

TEST_P(OpBackward, Bf16IsF32RoundedOnce) {
  const OpCase& c = find_op_case(GetParam());
  const Buffers inputs = make_inputs(c, true);
  const Buffers douts = make_douts(c, true);
  const CaseResult f32 = run_case(c, inputs, douts, DType::kF32, 1);
  const CaseResult bf16 = run_case(c, inputs, douts, DType::kBF16, 1);
  const std::vector<size_t> wrt = differentiable_inputs(c);
  ASSERT_EQ(bf16.grads.size(), wrt.size());
  for (size_t k = 0; k < wrt.size(); ++k) {
    EXPECT_TRUE(buffers_near(bf16.grads[k], f32.grads[k], kBf16Atol, kBf16Rtol,
                             grad_label(c, wrt[k], "bf16")));
  }
}

// README: backward kernels accumulate (+=) into every gradient, so two calls give twice one
// call; cross_entropy_backward is the one that writes, so two calls give one call.
TEST_P(OpBackward, SecondCallAccumulatesOrWritesAsDocumented) {
  const OpCase& c = find_op_case(GetParam());
  const Buffers inputs = make_inputs(c, false);
  const Buffers douts = make_douts(c, false);
  const CaseResult once = run_case(c, inputs, douts, DType::kF32, 1);
  const CaseResult twice = run_case(c, inputs, douts, DType::kF32, 2);
  const std::vector<size_t> wrt = differentiable_inputs(c);
  for (size_t k = 0; k < wrt.size(); ++k) {
    Buffer expected = once.grads[k];
    if (c.backward_accumulates) {
      for (double& v : expected) v *= 2.0;
    }
    // Sums over row blocks add in a different order the second time: reassociation only.
    EXPECT_TRUE(buffers_near(twice.grads[k], expected, 1e-6, 1e-5, grad_label(c, wrt[k], "twice")));
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpForward, ::testing::ValuesIn(case_names(false)),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Ops, OpBackward, ::testing::ValuesIn(case_names(true)),
                         [](const auto& info) { return info.param; });

// Guards against a case file silently dropping out of the build: every kernel of the brief
// has at least one registered case.
TEST(OpRegistry, EveryKernelHasACase) {
  std::set<std::string> prefixes;
  for (const OpCase& c : op_cases()) prefixes.insert(c.name.substr(0, c.name.find('_')));
  for (const char* op :
       {"embedding", "position", "layernorm", "rmsnorm", "gelu", "swiglu", "rope", "crossentropy",
        "add", "axpy", "scale", "sumsquares", "biasbackward", "split", "concat"}) {
    EXPECT_TRUE(prefixes.count(op)) << "no op case for " << op;
  }
}

TEST(GradientChecker, RejectsAWrongGradient) {
  // L = x0² · x1: dL/dx0 = 2·x0·x1, dL/dx1 = x0².
  auto loss = [](const Buffers& x) { return x[0][0] * x[0][0] * x[1][0]; };
  const Buffers inputs = {{1.5}, {-2.0}};
  EXPECT_TRUE(check_gradients(loss, inputs, {0, 1}, {{-6.0}, {2.25}}));
  EXPECT_FALSE(check_gradients(loss, inputs, {0, 1}, {{-6.0}, {2.5}}));
  EXPECT_FALSE(check_gradients(loss, inputs, {0}, {{6.0}}));
}

}  // namespace
}  // namespace lattice::optest
