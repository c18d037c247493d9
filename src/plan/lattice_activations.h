// Activation bytes of the Lattice runtime itself (TrainingSetup::runtime == Runtime::kLattice):
// what Transformer::slot_activations and Transformer::scratch (src/model/transformer.cpp)
// allocate on one rank, llm.c style: every buffer once, held for the whole run, the backward's
// working buffers included (model/model_description.h activation_table lists the same buffers
// by name). Korthikanti et al.'s model (activation_memory.h) counts what a layer must keep for
// its backward in 2-byte activations; Lattice keeps more:
//   - the residual stream in f32: each chunk's layer boundaries and each block's mid-point;
//   - the fused QKV output (GPT-2's c_attn), and split q, k, v copies where RoPE or context
//     parallelism needs them (otherwise attention reads q, k, v in the fused output);
//   - LayerNorm means and reciprocal deviations (also allocated for RMSNorm);
//   - one set of backward buffers (gradients of the residual, norm output, attention, q/k/v,
//     the MLP, RoPE inputs) and the f32 row-parallel output, whatever the layer count;
//   - f32 logits, their bf16 gradient copy under bf16 compute, the token losses, the
//     vocabulary-parallel cross-entropy's row statistics under tp;
//   - on a pipeline stage, the f32 gradient a chunk receives and the one it sends.
// Recompute keeps less per layer (selective: no attention output and log-sum-exp; full: only
// the layer's input, which is the residual boundary) and rebuilds into one shared set in the
// scratch. Zero-bubble schedules keep each layer's linear-map output gradients per slot.
// Shape letters: N = b·s token rows, R = N (÷ t under sequence parallelism), C = h, H = ffn / t,
// Q = h / t, K = kv / t, W = padded V / t.
#pragma once

#include "plan/activation_memory.h"
#include "plan/lattice_stages.h"
#include "plan/model_spec.h"

namespace lattice::plan {

struct LatticeActivationBytes {
  // Per activation slot (one per micro-batch in flight, lattice_activation_slots): the residual
  // boundaries, the chunks' received and sent gradients, every held layer's kept buffers (and
  // deferred weight-gradient inputs).
  double slot_layers = 0;
  double slot_head = 0;  // per slot on the head stage: final norm, f32 logits, losses, CE stats
  // Once per rank: the row-parallel output, backward's buffers, the logits' compute-dtype
  // gradient (bf16, head stage), the recomputed layer's buffers.
  double scratch = 0;
  double token_batch = 0;  // i32 inputs and targets of one micro-batch
};

// options.activation_bytes is the compute dtype's width (2 bf16, 4 f32); options.recompute as the
// runtime's; dropout does not exist in the runtime and is ignored. deferred_weights: the stage
// runs a zero-bubble schedule (zb-h1 with p > 1).
LatticeActivationBytes lattice_activation_bytes(const ModelSpec& model,
                                                const ActivationOptions& options,
                                                const LatticeStagePart& part,
                                                bool deferred_weights = false);

}  // namespace lattice::plan
