// Activation bytes of the Lattice runtime itself (TrainingSetup::runtime == Runtime::kLattice):
// what Transformer::ensure_activations (src/model/transformer.cpp) allocates for one micro-batch
// on one rank, llm.c style: every buffer once, held for the whole run, the backward's working
// buffers included. Korthikanti et al.'s model (activation_memory.h) counts what a layer must
// keep for its backward in 2-byte activations; Lattice keeps more:
//   - the residual stream in f32: the l + 1 block inputs and each block's mid-point;
//   - the fused QKV output (GPT-2's c_attn) and the split q, k, v copies;
//   - LayerNorm means and reciprocal deviations (also allocated for RMSNorm);
//   - one set of backward buffers (gradients of the residual, norm output, attention, q/k/v,
//     the MLP, RoPE inputs) and the f32 row-parallel output, whatever the layer count;
//   - f32 logits, their bf16 gradient copy under bf16 compute, the token losses, the
//     vocabulary-parallel cross-entropy's row statistics under tp;
//   - the micro-batch's i32 token ids and targets.
// Shape letters: N = b·s token rows, R = N (÷ t under sequence parallelism), C = h, H = ffn / t,
// Q = h / t, K = kv / t, W = padded V / t.
#pragma once

#include "plan/activation_memory.h"
#include "plan/model_spec.h"

namespace lattice::plan {

struct LatticeActivationBytes {
  double stored = 0;            // per-layer buffers × l + the l + 1 residual inputs
  double backward_scratch = 0;  // one set for all layers, and the row-parallel output
  double output = 0;            // final norm, logits (+ bf16 gradient), losses, vocab-parallel CE
  double token_batch = 0;       // i32 inputs and targets of one micro-batch
  double total() const { return stored + backward_scratch + output + token_batch; }
};

// options.activation_bytes is the compute dtype's width (2 bf16, 4 f32); recompute and dropout
// do not exist in the runtime and are ignored.
LatticeActivationBytes lattice_activation_bytes(const ModelSpec& model,
                                                const ActivationOptions& options);

}  // namespace lattice::plan
