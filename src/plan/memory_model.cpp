#include "plan/memory_model.h"

#include <algorithm>

#include "plan/activation_memory.h"
#include "plan/lattice_activations.h"
#include "plan/pipeline_theory.h"

namespace lattice::plan {

double stage_parameter_count(const ModelSpec& model, const Layout& layout, int64_t stage) {
  const ParameterCounts counts = count_parameters(model);
  const double t = double(layout.tp);
  const double layers = double(model.n_layers / layout.pp);
  double count = layers * (double(counts.per_layer - counts.per_layer_replicated) / t +
                           double(counts.per_layer_replicated));
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
  const double b = double(layout.micro_batch), s = double(setup.seq_len);
  const double h = double(model.d_model);
  const double sp_divisor = layout.sequence_parallel ? t : 1.0;

  MemoryBreakdown mem;
  mem.stage = stage;
  mem.capacity = setup.cluster.usable_memory_bytes();

  // Model states (ZeRO paper): 2 + 2 + 12 bytes per parameter in mixed precision.
  const double n = stage_parameter_count(model, layout, stage);
  mem.parameter_count = n;
  const ModelStateBytes states = model_state_bytes(n, layout.dp, layout.zero, bytes);
  mem.parameters = states.parameters;
  mem.gradients = states.gradients;
  mem.optimizer_states = states.optimizer_states;
  const bool lattice = setup.runtime == Runtime::kLattice;
  if (lattice && layout.tp > 1 && layout.sequence_parallel) {
    // Lattice packs the partial gradients of the replicated parameters (each tp rank saw only its
    // token rows) into one f32 buffer for their group all-reduce: norms and row-parallel biases
    // of every layer, the final norm, the learned position table.
    const ParameterCounts counts = count_parameters(model);
    double replicated = double(model.n_layers / layout.pp) * double(counts.per_layer_replicated);
    if (stage == 0 && model.position == PositionKind::kLearned)
      replicated += double(model.max_seq_len * model.d_model);
    if (stage == layout.pp - 1) replicated += double(counts.final_norm);
    mem.gradients += 4.0 * replicated;
  }

  // Activations: per layer × layers per chunk × chunks in flight on this stage.
  const ActivationOptions options{.micro_batch = layout.micro_batch,
                                  .seq_len = setup.seq_len,
                                  .tp = layout.tp,
                                  .sequence_parallel = layout.sequence_parallel,
                                  .recompute = layout.recompute,
                                  .dropout = setup.dropout,
                                  .flash_attention = setup.flash_attention,
                                  .activation_bytes = bytes.activation};
  const int64_t chunks =
      chunks_in_flight(layout.schedule, layout.pp, m, layout.virtual_stages, stage);
  const double layers_per_chunk = double(model.n_layers / (layout.pp * layout.virtual_stages));
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

  if (lattice && layout.pp == 1) {
    // The runtime's own buffers (lattice_activations.h) instead of the paper's model: one
    // micro-batch's set, allocated once. (It has no pipeline yet, and no recompute.)
    const LatticeActivationBytes own = lattice_activation_bytes(model, options);
    mem.activations = own.stored + own.backward_scratch;
    mem.recompute_working = 0;
    mem.embedding_activations = own.token_batch;
    mem.logits = own.output;
  }

  // Communication buffers (Lattice has none: in-place bucket reduction, tp collectives on
  // activation buffers).
  const double sbh_bytes = bytes.activation * s * b * h;
  if (!lattice) {
    if (layout.dp > 1) mem.communication_buffers += 2.0 * runtime.dp_bucket_bytes;
    if (layout.tp > 1) mem.communication_buffers += sbh_bytes;  // gathered / reduced block input
    if (layout.pp > 1) mem.communication_buffers += 2.0 * sbh_bytes / t;  // send + recv (÷t)
  }
  if (layout.zero >= 3) {
    const ParameterCounts counts = count_parameters(model);
    mem.zero3_gathered = 2.0 * double(counts.per_layer) / t * bytes.parameter;
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
  MemoryBreakdown last = estimate_stage_memory(setup, layout, layout.pp - 1);
  return last.total > first.total ? last : first;
}

}  // namespace lattice::plan
