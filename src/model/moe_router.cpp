#include "model/moe_router.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace lattice {

void validate_moe_layout(const ModelConfig& config, int cp, bool deferred_weight_grads, int ep,
                         int dp, int zero) {
  if (ep > 1) {
    if (!config.moe()) {
      LATTICE_THROW(ConfigError,
                    "--ep {}: model '{}' has no experts to spread ---> HINT: expert parallelism "
                    "needs model.n_experts > 0 (e.g. model.preset = \"mixtral-tiny\")",
                    ep, config.name);
    }
    if (config.n_experts % ep != 0 || dp % ep != 0) {
      LATTICE_THROW(ConfigError,
                    "--ep {} must divide model.n_experts = {} and --dp {} ---> HINT: each of ep "
                    "consecutive dp ranks holds n_experts / ep experts of every layer",
                    ep, config.n_experts, dp);
    }
    if (zero >= 2) {
      LATTICE_THROW(ConfigError,
                    "--ep {} with --zero {}: ZeRO-2/3 reduce gradients into shards of the whole "
                    "dp group, over which the experts' parameters differ ---> HINT: use --zero 0 "
                    "or 1 with expert parallelism (ZeRO-1 shards the optimizer over the dp / ep "
                    "ranks holding the same experts)",
                    ep, zero);
    }
  }
  if (!config.moe()) return;
  if (cp > 1) {
    LATTICE_THROW(ConfigError,
                  "model '{}' has mixture-of-experts layers, which route, cap and balance whole "
                  "sequences; --cp {} splits them ---> HINT: use --cp 1 with n_experts > 0",
                  config.name, cp);
  }
  if (deferred_weight_grads) {
    LATTICE_THROW(ConfigError,
                  "model '{}' has mixture-of-experts layers, whose weight gradients cannot be "
                  "deferred yet (schedule zb-h1) ---> HINT: use --schedule 1f1b or "
                  "interleaved-1f1b",
                  config.name);
  }
}

void route_tokens(const ModelConfig& config, const float* logits, int64_t tokens, int64_t T,
                  Routing& routing, float* probs, float* lse, bool padded) {
  const int64_t E = config.n_experts, k = config.experts_per_token;
  LATTICE_CHECK(T > 0 && tokens % T == 0, "routing {} tokens in sequences of {}", tokens, T);
  Routing& r = routing;
  r.tokens = tokens;
  r.experts = E;
  r.k = k;
  r.expert.assign(size_t(tokens * k), -1);
  r.gate.assign(size_t(tokens * k), 0.0f);
  r.row.assign(size_t(tokens * k), -1);
  r.chosen.assign(size_t(E), 0);
  r.dropped.assign(size_t(E), 0);
  const int64_t sequences = tokens / T;
  r.choice_share.assign(size_t(sequences * E), 0.0f);
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * E;
    float* p = probs + t * E;
    const float top = *std::max_element(l, l + E);
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(double(l[e] - top));
    lse[t] = top + float(std::log(sum));
    for (int64_t e = 0; e < E; ++e) p[e] = float(std::exp(double(l[e] - top)) / sum);
    for (int64_t e = 0; e < E; ++e) order[size_t(e)] = int32_t(e);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    double chosen_sum = 0.0;
    for (int64_t s = 0; s < k; ++s) chosen_sum += std::exp(double(l[order[size_t(s)]] - top));
    for (int64_t s = 0; s < k; ++s) {
      const int32_t e = order[size_t(s)];
      r.expert[size_t(t * k + s)] = e;
      r.gate[size_t(t * k + s)] = float(std::exp(double(l[e] - top)) / chosen_sum);
      ++r.chosen[size_t(e)];
      r.choice_share[size_t((t / T) * E + e)] += 1.0f / float(T * k);
    }
  }
  // Which choices are kept: all (dropless), or up to the capacity per sequence and expert.
  std::vector<char> kept(size_t(tokens * k), 1);
  if (config.capacity_factor > 0.0f) {
    const auto capacity =
        int64_t(std::ceil(double(config.capacity_factor) * double(T * k) / double(E)));
    std::vector<int64_t> used(static_cast<size_t>(E));
    for (int64_t b = 0; b < sequences; ++b) {
      std::fill(used.begin(), used.end(), 0);
      for (int64_t s = 0; s < k; ++s) {
        for (int64_t t = b * T; t < (b + 1) * T; ++t) {
          const int32_t e = r.expert[size_t(t * k + s)];
          if (used[size_t(e)] < capacity) {
            ++used[size_t(e)];
          } else {
            kept[size_t(t * k + s)] = 0;
            ++r.dropped[size_t(e)];
          }
        }
      }
    }
  }
  // Packed rows: expert-major, token order within an expert.
  r.expert_begin.assign(size_t(E) + 1, 0);
  for (int64_t i = 0; i < tokens * k; ++i) {
    if (kept[size_t(i)]) ++r.expert_begin[size_t(r.expert[size_t(i)]) + 1];
  }
  for (int64_t e = 0; e < E; ++e) {
    int64_t& rows = r.expert_begin[size_t(e) + 1];
    if (padded) rows = padded_rows(rows);
    rows += r.expert_begin[size_t(e)];
  }
  std::vector<int64_t> cursor(r.expert_begin.begin(), r.expert_begin.end() - 1);
  r.token_of_row.assign(size_t(r.rows()), -1);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t s = 0; s < k; ++s) {
      const size_t i = size_t(t * k + s);
      if (!kept[i]) continue;
      const int64_t m = cursor[size_t(r.expert[i])]++;
      r.row[i] = int32_t(m);
      r.token_of_row[size_t(m)] = int32_t(t);
    }
  }
}

double router_loss_sum(const ModelConfig& config, const Routing& routing, const float* probs,
                       const float* lse, int64_t T) {
  const int64_t E = routing.experts, tokens = routing.tokens;
  double total = 0.0;
  if (config.moe_aux_loss > 0.0f) {
    for (int64_t b = 0; b < tokens / T; ++b) {
      double balance = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        double mean_prob = 0.0;
        for (int64_t t = b * T; t < (b + 1) * T; ++t) mean_prob += probs[t * E + e];
        balance += double(routing.choice_share[size_t(b * E + e)]) * mean_prob / double(T);
      }
      total += double(config.moe_aux_loss) * double(T) * double(E) * balance;
    }
  }
  if (config.moe_z_loss > 0.0f) {
    for (int64_t t = 0; t < tokens; ++t) total += double(config.moe_z_loss) * lse[t] * lse[t];
  }
  return total;
}

void router_backward(const ModelConfig& config, const Routing& routing, const float* probs,
                     const float* lse, const float* dgate, int64_t T, float loss_scale,
                     float* dlogits) {
  const int64_t E = routing.experts, k = routing.k, tokens = routing.tokens;
  std::vector<float> dprob(static_cast<size_t>(E));
  for (int64_t t = 0; t < tokens; ++t) {
    float* dl = dlogits + t * E;
    const float* p = probs + t * E;
    std::fill(dl, dl + E, 0.0f);
    // Gates: the softmax over the chosen logits.
    double weighted = 0.0;
    for (int64_t s = 0; s < k; ++s) {
      weighted += double(routing.gate[size_t(t * k + s)]) * dgate[t * k + s];
    }
    for (int64_t s = 0; s < k; ++s) {
      const size_t i = size_t(t * k + s);
      dl[routing.expert[i]] += routing.gate[i] * float(double(dgate[i]) - weighted);
    }
    // Balance loss: d/dp_e of coef · T · E · Σ f_e · (Σ_t p_e) / T is coef · E · f_e; then
    // through the softmax over all experts.
    if (config.moe_aux_loss > 0.0f) {
      double dot = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        dprob[size_t(e)] = loss_scale * config.moe_aux_loss * float(E) *
                           routing.choice_share[size_t((t / T) * E + e)];
        dot += double(p[e]) * dprob[size_t(e)];
      }
      for (int64_t e = 0; e < E; ++e) dl[e] += p[e] * float(double(dprob[size_t(e)]) - dot);
    }
    // z-loss: d(coef · lse²)/dl_e = 2 · coef · lse · p_e.
    if (config.moe_z_loss > 0.0f) {
      const float dz = loss_scale * 2.0f * config.moe_z_loss * lse[t];
      for (int64_t e = 0; e < E; ++e) dl[e] += dz * p[e];
    }
  }
}

}  // namespace lattice
