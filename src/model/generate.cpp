#include "model/generate.h"

#include <cmath>

#include "core/philox.h"

namespace lattice {

namespace {

// Index drawn from softmax(logits / temperature) with the uniform draw u in [0, 1).
int32_t sample_row(const float* logits, int64_t V, float temperature, float u) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  if (temperature <= 0.0f) return int32_t(best);
  std::vector<double> p(static_cast<size_t>(V));
  double sum = 0.0;
  for (int64_t i = 0; i < V; ++i) {
    p[size_t(i)] = std::exp(double(logits[i] - logits[best]) / double(temperature));
    sum += p[size_t(i)];
  }
  double target = double(u) * sum, cumulative = 0.0;
  for (int64_t i = 0; i < V; ++i) {
    cumulative += p[size_t(i)];
    if (target < cumulative) return int32_t(i);
  }
  return int32_t(V - 1);
}

}  // namespace

std::vector<int32_t> generate(Transformer& model, std::vector<int32_t> prompt,
                              const SampleOptions& options) {
  if (prompt.empty()) LATTICE_THROW(ValueError, "generate: the prompt is empty");
  const int64_t V = model.config().vocab_size, max_context = model.config().seq_len;
  for (int32_t t : prompt) {
    if (t < 0 || t >= V) {
      LATTICE_THROW(ValueError, "generate: prompt token {} is outside the vocabulary [0, {})", t,
                    V);
    }
  }
  // Under tensor parallelism every rank of the group runs this loop in step (same seed, same
  // tokens); sequence parallelism is switched off so that any context length works.
  // Context parallelism too: every rank of a cp group runs the whole context.
  const bool sequence_parallel = model.tensor_parallel().sequence_parallel();
  const bool context_parallel = model.context_parallel_on();
  model.set_sequence_parallel(false);
  model.set_context_parallel(false);
  PhiloxStream stream(options.seed, hash_name("sample"));
  std::vector<int32_t> tokens = std::move(prompt);
  for (int64_t n = 0; n < options.tokens; ++n) {
    const int64_t T = std::min<int64_t>(int64_t(tokens.size()), max_context);
    std::vector<int32_t> context(tokens.end() - T, tokens.end());
    Tensor input = Tensor::borrow(context.data(), {1, T}, DType::kI32);
    model.forward(input, Tensor());
    const std::vector<float> last = model.logits_row(T - 1);
    tokens.push_back(sample_row(last.data(), V, options.temperature, stream.next_uniform()));
  }
  model.set_sequence_parallel(sequence_parallel);
  model.set_context_parallel(context_parallel);
  return tokens;
}

}  // namespace lattice
