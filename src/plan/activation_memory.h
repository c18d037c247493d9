// Activation bytes one transformer layer keeps for its backward, per micro-batch, per rank —
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
// Table 2, generalised to grouped-query attention, SwiGLU, any activation width, and the
// runtime's switches (dropout, flash-style attention). With dropout on, 2-byte activations,
// ffn = 4h and g = a it reproduces the table exactly:
//   none sbh(34 + 5as/h)   TP sbh(10 + 24/t + 5as/(ht))   TP+SP sbh(34/t + 5as/(ht))
//   TP+selective sbh(10 + 24/t)   TP+SP+selective 34sbh/t   full recompute 2sbh (÷t with SP)
// With flash-style attention selective recompute has nothing left to drop (Megatron's flash
// path behaves the same way).
#pragma once

#include <cstdint>

#include "plan/layout.h"
#include "plan/model_spec.h"

namespace lattice::plan {

struct ActivationOptions {
  int64_t micro_batch = 1;  // b
  int64_t seq_len = 0;      // s
  int64_t tp = 1;           // t
  bool sequence_parallel = false;
  Recompute recompute = Recompute::kNone;
  bool dropout = false;           // 1-byte masks after attention probabilities, attention, MLP
  bool flash_attention = true;    // s×s scores never stored; f32 log-sum-exp (a·s·b) instead
  double activation_bytes = 2;    // bytes per stored activation element
  int64_t ep = 1;                 // expert parallelism (sparse layers): the experts' group size
  bool context_parallel = false;  // cp > 1 (the Lattice runtime's q, k, v buffers depend on it)
};

// Bytes stored between a layer's forward and its backward.
double layer_activation_bytes(const ModelSpec& model, const ActivationOptions& options);
// Bytes live while one layer runs its backward beyond what is stored: with full recompute the
// layer's whole activation set is rebuilt; otherwise 0.
double recompute_working_bytes(const ModelSpec& model, const ActivationOptions& options);

}  // namespace lattice::plan
