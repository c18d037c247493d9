// The router of a mixture-of-experts layer (Mixtral's sparse MLP, docs/moe.md): which experts
// each token goes to, with which weights, in which packed row, and the router's losses and
// their gradient. Pure functions on host arrays: the transformer runs the experts' GEMMs on
// the packed rows, and expert parallelism sends them to the ranks that hold their experts.
//
// Every choice is deterministic and a function of one sequence's tokens alone, so that any
// split of a batch's rows (dp, micro-batches, pp) routes and drops exactly as one rank does:
//   - top-k by logit, ties to the lower expert index;
//   - gates: the softmax over the chosen experts' logits (Mixtral's softmax over all, top-k,
//     renormalised: the same numbers);
//   - capacity (capacity_factor > 0): expert e takes at most ceil(factor · T · k / E) of a
//     sequence's choices: every token's first choice before any second choice, each in position
//     order (GShard's priority); a dropped choice adds nothing (the residual carries the token);
//   - the load-balancing loss per sequence (Switch form): coef · E · Σ_e f_e · P_e, with f_e the
//     share of the sequence's T · k choices that picked e (before any dropping) and P_e its
//     mean router probability (softmax over all experts); the loss is its mean over sequences;
//   - the z-loss: coef · mean over tokens of logsumexp(logits)².
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "spec/expert_rows.h"

namespace lattice {

// ConfigError, before any rank allocates, for a layout the sparse layers cannot run yet:
// context parallelism (routing, capacity and the balance loss work on whole sequences) and
// deferred weight gradients (zero-bubble schedules).
// Expert parallelism (ep > 1) also needs a sparse model whose experts split evenly over ep,
// ep dividing dp, and ZeRO-0 (the sharded optimizer's ranges are laid out over the whole dp
// group, which expert parameters are not replicated over).
void validate_moe_layout(const ModelConfig& config, int cp, bool deferred_weight_grads, int ep = 1,
                         int dp = 1, int zero = 0);

struct Routing {
  int64_t tokens = 0, experts = 0, k = 0;
  // Per (token, slot), token-major (tokens · k): the chosen expert, its gate weight, and the
  // packed row it was dispatched to (-1: dropped by the capacity).
  std::vector<int32_t> expert;
  std::vector<float> gate;
  std::vector<int32_t> row;
  // Packed rows: those of expert e are [expert_begin[e], expert_begin[e + 1]), in token order;
  // token_of_row[m] is the token row m carries (-1: a padding row, all zeros).
  std::vector<int64_t> expert_begin;
  std::vector<int32_t> token_of_row;
  // Per expert: the choices that picked it (before dropping) and those dropped.
  std::vector<int64_t> chosen, dropped;
  // Per (sequence, expert): the share f of the sequence's choices, for the aux loss.
  std::vector<float> choice_share;
  int64_t rows() const { return expert_begin.empty() ? 0 : expert_begin.back(); }
};

// Routes `tokens` rows of router logits (tokens, E), tokens a multiple of seq_len T (whole
// sequences). Writes probs (tokens, E): the softmax over all experts, and lse (tokens): the
// logits' logsumexp.
// padded: each expert's block of rows is rounded up to a few sizes per octave (padded_rows),
// the extra rows carrying no token (token_of_row -1): the experts' GEMMs then see few distinct
// shapes, and oneDNN keeps a prepared primitive per shape instead of building one per step.
void route_tokens(const ModelConfig& config, const float* logits, int64_t tokens, int64_t T,
                  Routing& routing, float* probs, float* lse, bool padded = false);

// padded_rows, max_padded_rows: spec/expert_rows.h.

// The router's losses for these tokens, as a sum to be divided by the global token count like
// the token losses: coef · T · (balance loss) per sequence plus z coef · lse² per token.
double router_loss_sum(const ModelConfig& config, const Routing& routing, const float* probs,
                       const float* lse, int64_t T);

// dlogits (tokens, E) = the gradient of the router's logits, from the gates' gradient
// dgate (tokens · k, token-major) and the losses' (scaled by loss_scale, the backward's
// 1 / global tokens).
void router_backward(const ModelConfig& config, const Routing& routing, const float* probs,
                     const float* lse, const float* dgate, int64_t T, float loss_scale,
                     float* dlogits);

}  // namespace lattice
