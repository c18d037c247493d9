#include "plan/evaluation.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace lattice::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Rejection reject(RejectReason reason, std::string message) {
  return {reason, std::move(message)};
}

std::string memory_message(const MemoryBreakdown& mem, const Layout& layout) {
  const std::vector<std::pair<const char*, double>> parts = {
      {"parameters", mem.parameters},
      {"gradients", mem.gradients},
      {"optimizer states", mem.optimizer_states},
      {"activations", mem.activations + mem.recompute_working + mem.embedding_activations},
      {"logits", mem.logits},
      {"buffers", mem.communication_buffers + mem.zero3_gathered},
  };
  auto largest = parts.front();
  for (const auto& part : parts) {
    if (part.second > largest.second) largest = part;
  }
  std::string fix;
  if (std::string_view(largest.first) == "activations") {
    fix = layout.recompute != Recompute::kFull ? "recompute, sequence parallelism, a smaller "
                                                 "micro-batch or more tp"
                                               : "a smaller micro-batch, more tp or more pp";
  } else if (std::string_view(largest.first) == "logits") {
    fix = "a smaller micro-batch or more tp";
  } else {
    fix = layout.zero < 3 && layout.dp > 1 ? "a higher ZeRO stage, more tp or more pp"
                                           : "more tp or more pp";
  }
  return fmt::format(
      "needs {:.1f} GiB per rank on pipeline stage {} but the device offers "
      "{:.1f} GiB; the largest part is {} ({:.1f} GiB) ---> HINT: {}",
      mem.total / kGiB, mem.stage, mem.capacity / kGiB, largest.first, largest.second / kGiB, fix);
}

}  // namespace

std::string_view reject_reason_name(RejectReason reason) {
  switch (reason) {
    case RejectReason::kDeviceCount:
      return "device count";
    case RejectReason::kDivisibility:
      return "divisibility";
    case RejectReason::kBatch:
      return "batch";
    case RejectReason::kSchedule:
      return "schedule";
    case RejectReason::kMemory:
      return "memory";
  }
  return "?";
}

namespace {

// What the runtime's validate_moe_layout (model/moe_router.h) refuses, as the planner's
// rejections.
std::optional<Rejection> check_experts(const TrainingSetup& setup, const Layout& l) {
  const ModelSpec& model = setup.model;
  if (l.ep > 1 && !model.moe()) {
    return reject(RejectReason::kDivisibility,
                  fmt::format("ep {}: model '{}' has no experts to spread ---> HINT: use ep 1 "
                              "with a dense model",
                              l.ep, model.name));
  }
  if (!model.moe()) return std::nullopt;
  if (model.n_experts % l.ep != 0 || l.dp % l.ep != 0) {
    return reject(RejectReason::kDivisibility,
                  fmt::format("ep {} must divide the {} experts and dp {} ---> HINT: each of ep "
                              "consecutive dp ranks holds n_experts / ep experts of every layer",
                              l.ep, model.n_experts, l.dp));
  }
  if (l.ep > 1 && l.zero >= 2) {
    return reject(RejectReason::kSchedule,
                  fmt::format("ep {} with ZeRO-{}: ZeRO-2/3 reduce gradients into shards of the "
                              "whole dp group, over which the experts differ ---> HINT: use zero "
                              "0 or 1 with ep",
                              l.ep, l.zero));
  }
  if (l.cp > 1) {
    return reject(RejectReason::kSchedule,
                  fmt::format("cp {} with mixture-of-experts layers, which route, cap and balance "
                              "whole sequences ---> HINT: use cp 1",
                              l.cp));
  }
  if (l.pp > 1 && l.schedule == Schedule::kZeroBubbleH1) {
    return reject(RejectReason::kSchedule,
                  "schedule zb-h1 with mixture-of-experts layers, whose weight gradients cannot "
                  "be deferred yet ---> HINT: use 1f1b or interleaved-1f1b");
  }
  return std::nullopt;
}

}  // namespace

std::optional<Rejection> check_layout(const TrainingSetup& setup, const Layout& l) {
  const ModelSpec& model = setup.model;
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.cp < 1 || l.ep < 1 || l.virtual_stages < 1 ||
      l.micro_batch < 1 || l.zero < 0 || l.zero > 3) {
    return reject(RejectReason::kDivisibility,
                  fmt::format("{}: every size must be at least 1 and zero in 0..3", describe(l)));
  }
  if (l.devices() != setup.devices) {
    return reject(RejectReason::kDeviceCount,
                  fmt::format("dp {} × tp {} × pp {}{} = {} ranks but there are {} devices ---> "
                              "HINT: choose sizes whose product is {}",
                              l.dp, l.tp, l.pp, l.cp > 1 ? fmt::format(" × cp {}", l.cp) : "",
                              l.devices(), setup.devices, setup.devices));
  }
  auto divides = [](int64_t d, int64_t n) { return n % d == 0; };
  if (!divides(2 * l.cp, setup.seq_len)) {
    return reject(RejectReason::kDivisibility,
                  fmt::format("context parallelism cuts the sequence of {} into 2·cp = {} equal "
                              "chunks, which do not divide it ---> HINT: use a cp with {} a "
                              "multiple of 2·cp",
                              setup.seq_len, 2 * l.cp, setup.seq_len));
  }
  if (!divides(l.tp, model.n_heads) || !divides(l.tp, model.n_kv_heads)) {
    return reject(RejectReason::kDivisibility,
                  fmt::format("tp {} does not divide the {} query heads and {} key/value heads "
                              "---> HINT: use a tp dividing {}",
                              l.tp, model.n_heads, model.n_kv_heads, model.n_kv_heads));
  }
  if (!divides(l.tp, model.d_ff)) {
    return reject(RejectReason::kDivisibility,
                  fmt::format("tp {} does not divide d_ff {}", l.tp, model.d_ff));
  }
  if (l.sequence_parallel && !divides(l.tp, setup.seq_len / l.cp)) {
    return reject(RejectReason::kDivisibility,
                  fmt::format("sequence parallelism splits the sequence of {} over tp {}, which "
                              "does not divide it",
                              setup.seq_len / l.cp, l.tp));
  }
  // Layers need not divide evenly over the p·v chunks: the runtime's balanced partition (or the
  // layout's layers_per_chunk) places them; every chunk needs at least one (a given split may
  // leave its two end chunks empty, checked below).
  if (l.layers_per_chunk.empty() && l.pp * l.virtual_stages > model.n_layers) {
    return reject(RejectReason::kDivisibility,
                  fmt::format("pp {} × v {} = {} pipeline chunks but only {} layers ---> HINT: "
                              "use at most {} chunks",
                              l.pp, l.virtual_stages, l.pp * l.virtual_stages, model.n_layers,
                              model.n_layers));
  }
  if (!l.layers_per_chunk.empty()) {
    // Megatron-style runtimes may leave the first and last chunk empty (the embedding alone, the
    // head alone: Llama 3 §3.3.2); Lattice's partition gives every chunk a layer.
    if (int64_t(l.layers_per_chunk.size()) != l.pp * l.virtual_stages ||
        !valid_layer_split(l.layers_per_chunk, model.n_layers, l.pp,
                           setup.runtime != Runtime::kLattice)) {
      return reject(RejectReason::kDivisibility,
                    fmt::format("layers per chunk {} must be pp {} × v {} counts of at least one "
                                "layer summing to the {} layers ---> HINT: e.g. Llama 3's "
                                "7,8×14,7 for 126 layers on 16 stages",
                                describe_layer_counts(l.layers_per_chunk), l.pp, l.virtual_stages,
                                model.n_layers));
    }
  }
  if (!divides(l.dp * l.micro_batch, setup.global_batch)) {
    return reject(RejectReason::kBatch,
                  fmt::format("global batch {} is not a multiple of dp {} × micro-batch {} ---> "
                              "HINT: use a global batch divisible by {}",
                              setup.global_batch, l.dp, l.micro_batch, l.dp * l.micro_batch));
  }
  const int64_t m = micro_batches(l, setup.global_batch);
  if (l.schedule == Schedule::kInterleaved1F1B) {
    if (l.pp < 2 || l.virtual_stages < 2) {
      return reject(RejectReason::kSchedule,
                    "the interleaved schedule needs pp ≥ 2 and v ≥ 2 ---> HINT: use 1f1b or set "
                    "--virtual-stages");
    }
    if (m % l.pp != 0) {
      return reject(RejectReason::kSchedule,
                    fmt::format("the interleaved schedule needs the {} micro-batches to be a "
                                "multiple of pp {}",
                                m, l.pp));
    }
  } else if (l.virtual_stages != 1) {
    return reject(RejectReason::kSchedule,
                  fmt::format("v = {} model chunks per rank needs the interleaved schedule",
                              l.virtual_stages));
  }
  if (setup.runtime == Runtime::kLattice && l.pp > 1 && l.zero >= 2) {
    return reject(RejectReason::kSchedule,
                  fmt::format("ZeRO-{} with pp {}: Lattice's ZeRO-2/3 shard gradients (and "
                              "parameters) per backward, which its pipeline schedules do not "
                              "drive yet ---> HINT: use zero 0 or 1 with pp > 1",
                              l.zero, l.pp));
  }
  if (auto moe = check_experts(setup, l)) return moe;
  if (l.pp > 1 && l.schedule == Schedule::kZeroBubbleH1 && l.recompute != Recompute::kNone) {
    // Lattice's runtime refuses the pair (train/trainer.cpp): the weight-gradient pass reads
    // activations that recompute would have dropped.
    return reject(RejectReason::kSchedule,
                  fmt::format("schedule zb-h1 defers weight gradients, which needs every "
                              "activation kept; recompute {} drops them ---> HINT: use recompute "
                              "none with zb-h1, or 1f1b / interleaved with recompute",
                              recompute_name(l.recompute)));
  }
  return std::nullopt;
}

Evaluation evaluate(const TrainingSetup& setup, const Layout& layout) {
  Evaluation e;
  e.layout = layout;
  e.rejection = check_layout(setup, layout);
  if (e.rejection) return e;
  // An uneven pipeline without a given split takes the balanced partition, computed once here
  // rather than by every stage's memory and time (and shown by describe()). The Lattice runtime's
  // model keeps computing its own partition, even or not, as before.
  if (layout.layers_per_chunk.empty() && setup.runtime == Runtime::kMegatron)
    e.layout.layers_per_chunk = default_split(setup.model, layout.pp, layout.virtual_stages);
  e.memory = estimate_memory(setup, e.layout);
  e.time = estimate_time(setup, e.layout);
  if (!e.memory.fits())
    e.rejection = reject(RejectReason::kMemory, memory_message(e.memory, e.layout));
  return e;
}

}  // namespace lattice::plan
