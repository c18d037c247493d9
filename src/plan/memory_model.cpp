#include "plan/memory_model.h"

#include <algorithm>

#include "plan/activation_memory.h"
#include "plan/lattice_activations.h"
#include "plan/lattice_stages.h"
#include "plan/pipeline_theory.h"

namespace lattice::plan {

std::vector<int64_t> chunk_layer_counts(const TrainingSetup& setup, const Layout& layout) {
  const int64_t chunks = layout.pp * layout.virtual_stages, layers = setup.model.n_layers;
  // A given split was checked by check_layout (the Lattice runtime's partition checks it again,
  // as the runtime does).
  if (!layout.layers_per_chunk.empty() && setup.runtime != Runtime::kLattice)
    return layout.layers_per_chunk;
  if (!layout.layers_per_chunk.empty() || setup.runtime == Runtime::kLattice ||
      layers % chunks != 0) {
    return lattice_layers_per_chunk(setup.model, layout.pp, layout.virtual_stages,
                                    layout.layers_per_chunk);
  }
  return std::vector<int64_t>(size_t(chunks), layers / chunks);
}

std::vector<int64_t> default_split(const ModelSpec& model, int64_t pp, int64_t v) {
  const int64_t chunks = pp * v;
  if (chunks <= 1 || chunks > model.n_layers || model.n_layers % chunks == 0) return {};
  return lattice_layers_per_chunk(model, pp, v);
}

int64_t stage_layers(const TrainingSetup& setup, const Layout& layout, int64_t stage) {
  const std::vector<int64_t> counts = chunk_layer_counts(setup, layout);
  int64_t held = 0;
  for (size_t k = size_t(stage); k < counts.size(); k += size_t(layout.pp)) held += counts[k];
  return held;
}

double stage_parameter_count(const ModelSpec& model, const Layout& layout, int64_t stage,
                             int64_t held_layers) {
  const ParameterCounts counts = count_parameters(model);
  const double t = double(layout.tp);
  const double layers = double(held_layers);
  const int64_t split = counts.per_layer - counts.per_layer_replicated - counts.per_layer_router -
                        counts.per_layer_experts;
  double count = layers * (double(split) / t + double(counts.per_layer_replicated) +
                           double(counts.per_layer_router)) +
                 stage_expert_parameter_count(model, layout, held_layers);
  const double word_embedding = double(model.padded_vocab_size * model.d_model);
  if (stage == 0) {
    count += word_embedding / t + double(counts.embedding) - word_embedding;  // positions whole
  }
  if (stage == layout.pp - 1) {
    count += double(counts.final_norm);
    if (!model.tied_embeddings || layout.pp > 1) count += word_embedding / t;
  }
  return count;
}

double stage_expert_parameter_count(const ModelSpec& model, const Layout& layout,
                                    int64_t held_layers) {
  return double(held_layers) * double(count_parameters(model).per_layer_experts) /
         double(layout.tp * layout.ep);
}

int64_t zero_group(const TrainingSetup& setup, const Layout& layout, bool experts) {
  if (experts || (setup.runtime == Runtime::kLattice && layout.ep > 1))
    return layout.replicas() / layout.ep;
  return layout.replicas();
}

ModelStateBytes model_state_bytes(double parameters, int64_t dp, int zero,
                                  const StateBytes& bytes) {
  const double n = double(dp);
  return {.parameters = parameters * bytes.parameter / (zero >= 3 ? n : 1.0),
          .gradients = parameters * bytes.gradient / (zero >= 2 ? n : 1.0),
          .optimizer_states = parameters * bytes.optimizer / (zero >= 1 ? n : 1.0)};
}

MemoryBreakdown estimate_stage_memory(const TrainingSetup& setup, const Layout& layout,
                                      int64_t stage) {
  const ModelSpec& model = setup.model;
  const StateBytes bytes = setup.bytes();
  const RuntimeFactors& runtime = setup.cluster.runtime;
  const double t = double(layout.tp);
  const int64_t m = micro_batches(layout, setup.global_batch);
  // s: the positions of a sequence this rank holds (all of them without context parallelism);
  // every activation is per position.
  const int64_t local_seq = setup.seq_len / layout.cp;
  const double b = double(layout.micro_batch), s = double(local_seq);
  const double h = double(model.d_model);
  const double sp_divisor = layout.sequence_parallel ? t : 1.0;
  const int64_t replicas = layout.replicas();

  MemoryBreakdown mem;
  mem.stage = stage;
  mem.capacity = setup.memory_capacity();

  const bool lattice = setup.runtime == Runtime::kLattice;
  const int64_t held_layers = stage_layers(setup, layout, stage);

  // Model states (ZeRO paper): 2 + 2 + 12 bytes per parameter in mixed precision. The experts'
  // are sharded over the ranks holding the same experts (zero_group).
  const double n = stage_parameter_count(model, layout, stage, held_layers);
  const double experts = stage_expert_parameter_count(model, layout, held_layers);
  mem.parameter_count = n;
  const int64_t sharded_over = zero_group(setup, layout, false);
  const ModelStateBytes dense = model_state_bytes(n - experts, sharded_over, layout.zero, bytes);
  const ModelStateBytes sparse =
      model_state_bytes(experts, zero_group(setup, layout, true), layout.zero, bytes);
  mem.parameters = dense.parameters + sparse.parameters;
  mem.gradients = dense.gradients + sparse.gradients;
  mem.optimizer_states = dense.optimizer_states + sparse.optimizer_states;
  if (lattice && layout.tp > 1 && layout.sequence_parallel) {
    // Lattice packs the partial gradients of the replicated parameters (each tp rank saw only its
    // token rows) into one f32 buffer for their group all-reduce: norms and row-parallel biases
    // of every layer, the final norm, the learned position table.
    const ParameterCounts counts = count_parameters(model);
    double replicated = double(held_layers) * double(counts.per_layer_replicated);
    if (stage == 0 && model.position == PositionKind::kLearned)
      replicated += double(model.max_seq_len * model.d_model);
    if (stage == layout.pp - 1) replicated += double(counts.final_norm);
    mem.gradients += 4.0 * replicated;
  }

  // Activations: per layer × layers per chunk × chunks in flight on this stage.
  const ActivationOptions options{.micro_batch = layout.micro_batch,
                                  .seq_len = local_seq,
                                  .tp = layout.tp,
                                  .sequence_parallel = layout.sequence_parallel,
                                  .recompute = layout.recompute,
                                  .dropout = setup.dropout,
                                  .flash_attention = setup.flash_attention,
                                  .activation_bytes = bytes.activation,
                                  .ep = layout.ep,
                                  .context_parallel = layout.cp > 1};
  const int64_t chunks =
      chunks_in_flight(layout.schedule, layout.pp, m, layout.virtual_stages, stage);
  const double layers_per_chunk = double(held_layers) / double(layout.virtual_stages);
  mem.activations = layer_activation_bytes(model, options) * layers_per_chunk * double(chunks);
  mem.recompute_working = recompute_working_bytes(model, options);

  // Micro-batches whose embedding inputs stage 0 holds: one per chunk in flight (an upper
  // bound when interleaving, where only the first chunk embeds), one without a pipeline.
  const double micro_batches_in_flight = double(std::min<int64_t>(chunks, layout.pp > 1 ? m : 1));
  if (stage == 0) {
    // Token ids (int32) and, with dropout, the embedding dropout mask.
    mem.embedding_activations =
        micro_batches_in_flight * (4.0 * s * b + (setup.dropout ? s * b * h / sp_divisor : 0.0));
  }
  if (stage == layout.pp - 1) {
    // f32 logits of this rank's vocabulary shard, kept for the loss backward (which overwrites
    // them with their gradient), plus the final norm's input and the output layer's input.
    const double logits = 4.0 * s * b * double(model.padded_vocab_size) / t;
    const double inputs = bytes.activation * s * b * h * (1.0 / sp_divisor + 1.0);
    const double last_chunk_in_flight =
        layout.schedule == Schedule::kGpipe && layout.pp > 1 ? double(m) : 1.0;
    mem.logits = (logits + inputs) * last_chunk_in_flight;
  }

  if (lattice) {
    // The runtime's own buffers (lattice_activations.h) instead of the paper's model: a slot of
    // all the stage's chunks per micro-batch in flight (lattice_stages.h), one scratch, and the
    // token batches: the trainer's own and, with a pipeline, one per micro-batch of the step.
    const LatticeStagePart part = lattice_stage_part(model, layout.pp, layout.virtual_stages, stage,
                                                     chunk_layer_counts(setup, layout));
    const bool deferred = layout.pp > 1 && layout.schedule == Schedule::kZeroBubbleH1;
    const LatticeActivationBytes own = lattice_activation_bytes(model, options, part, deferred);
    const double slots = double(
        lattice_activation_slots(layout.schedule, layout.pp, m, layout.virtual_stages, stage));
    mem.activations = slots * own.slot_layers;
    mem.logits = slots * own.slot_head;
    mem.recompute_working = own.scratch;
    mem.embedding_activations = own.token_batch * double(1 + (layout.pp > 1 ? m : 0));
    // Under context parallelism the trainer reads whole rows before taking its chunks.
    if (layout.cp > 1) mem.embedding_activations += own.token_batch * double(layout.cp);
    // The pipeline runtime stages every send in its own f32 (R, C) buffer, kept per
    // (micro-batch, chunk): activations from every chunk but the model's last, gradients from
    // every chunk but its first.
    const double rows = b * s / (layout.sequence_parallel ? t : 1.0);
    for (const LatticeChunk& chunk : part.chunks) {
      const double sends = double(int(!chunk.head) + int(!chunk.embedding)) * double(m);
      if (layout.pp > 1) mem.communication_buffers += sends * rows * h * 4.0;
    }
  }

  // Communication buffers (Lattice has none but the pipeline's send staging above: in-place
  // bucket reduction, tp collectives on activation buffers).
  const double sbh_bytes = bytes.activation * s * b * h;
  if (layout.cp > 1) {
    // The ring's two key/value blocks (the one in hand, the one arriving) and, in the backward,
    // the two blocks of their gradients (f32 in Lattice, the activation dtype in Megatron-LM).
    const double kv_block = 2.0 * b * s * double(model.kv_dim()) / t;
    mem.communication_buffers +=
        2.0 * kv_block * (bytes.activation + (lattice ? 4.0 : bytes.activation));
    if (lattice) {
      // Lattice's ring backward also copies its query chunks, their output gradients and outputs
      // (compute dtype), sums dq in f32 and keeps the chunks' log-sum-exp: its workspace peak.
      const double queries = b * s * double(model.n_heads) / t * double(model.head_dim());
      mem.communication_buffers +=
          queries * (3.0 * bytes.activation + 4.0) + 4.0 * b * s * double(model.n_heads) / t;
    }
  }
  if (!lattice) {
    if (replicas > 1) mem.communication_buffers += 2.0 * runtime.dp_bucket_bytes;
    if (layout.tp > 1) mem.communication_buffers += sbh_bytes;  // gathered / reduced block input
    if (layout.pp > 1) mem.communication_buffers += 2.0 * sbh_bytes / t;  // send + recv (÷t)
  }
  if (layout.zero >= 3 && !lattice) {
    const ParameterCounts counts = count_parameters(model);
    mem.zero3_gathered = 2.0 * double(counts.per_layer) / t * bytes.parameter;
  }
  if (lattice && sharded_over > 1 && (layout.zero == 1 || layout.zero == 2) &&
      setup.precision == Precision::kBf16) {
    // Under bf16 compute Lattice's ZeRO-1/2 shard the f32 master too; every rank keeps the bf16
    // compute copy whole and an f32 copy of the parameters the forward reads in f32 (E: every
    // 1-D parameter — norms, biases — and the token and position tables; not the last stage's
    // tied copy): 2Ψ + 4E + 4Ψ/N (docs/data-parallel.md).
    const ParameterCounts counts = count_parameters(model);
    const double column_biases =
        model.biases ? double(model.d_model + 2 * model.kv_dim() + model.d_ff) : 0.0;
    double read_as_f32 =
        double(held_layers) * (double(counts.per_layer_replicated) + column_biases / t);
    if (stage == 0) {
      read_as_f32 +=
          double(model.padded_vocab_size * model.d_model) / t +
          (model.position == PositionKind::kLearned ? double(model.max_seq_len * model.d_model)
                                                    : 0.0);
    }
    if (stage == layout.pp - 1) read_as_f32 += double(counts.final_norm);
    mem.parameters = 4.0 * n / double(sharded_over) + 2.0 * n + 4.0 * read_as_f32;
  }
  if (lattice && replicas > 1 && layout.zero >= 2) {
    // Lattice's ZeRO-2/3 (docs/data-parallel.md; data_parallel/sharded_gradients.h,
    // gathered_parameters.h). Gradients: the f32 shard, plus the buckets lent to the backward
    // until their reduction to the owners completes — predicted as all of them (4 bytes per
    // parameter), which models of a few buckets reach; ShardedGradients::lent_bound caps it
    // lower for many buckets (not modelled: the planner errs towards "does not fit"). ZeRO-3
    // parameters: the f32 master shard only (no compute copy between steps), plus the units
    // gathered at once — the ends (embeddings, final norm, head) and the two largest layers (the
    // current one and the prefetch) — in f32 and, under bf16, a compute copy. The arena books the
    // gathered units as parameters.
    const double dp = double(replicas);
    mem.gradients = 4.0 * n / dp + 4.0 * n;
    if (layout.zero >= 3) {
      const double ends = stage_parameter_count(model, layout, stage, 0);
      const double layer = stage_parameter_count(model, layout, stage, 1) - ends;
      const double gathered = ends + std::min<double>(2.0, double(held_layers)) * layer;
      mem.parameters = 4.0 * n / dp + gathered * (bytes.parameter > 4.0 ? 6.0 : 4.0);
    }
  }

  const double dynamic = mem.activations + mem.recompute_working + mem.embedding_activations +
                         mem.logits + mem.communication_buffers + mem.zero3_gathered;
  mem.fragmentation = runtime.fragmentation * dynamic;
  mem.total = mem.parameters + mem.gradients + mem.optimizer_states + dynamic + mem.fragmentation;
  return mem;
}

MemoryBreakdown estimate_memory(const TrainingSetup& setup, const Layout& layout) {
  // The first stage holds the most micro-batches and the embedding; the last holds the logits
  // and the output layer. Middle stages hold less than the first.
  MemoryBreakdown first = estimate_stage_memory(setup, layout, 0);
  if (layout.pp == 1) return first;
  if (setup.runtime == Runtime::kLattice ||
      setup.model.n_layers % (layout.pp * layout.virtual_stages) != 0 ||
      !layout.layers_per_chunk.empty()) {
    for (int64_t stage = 1; stage < layout.pp; ++stage) {
      MemoryBreakdown other = estimate_stage_memory(setup, layout, stage);
      if (other.total > first.total) first = other;
    }
    return first;
  }
  MemoryBreakdown last = estimate_stage_memory(setup, layout, layout.pp - 1);
  return last.total > first.total ? last : first;
}

}  // namespace lattice::plan
