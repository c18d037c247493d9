// Predicted memory of one rank: every component, on the most loaded pipeline stage.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/layout.h"
#include "plan/training_setup.h"

namespace lattice::plan {

struct MemoryBreakdown {
  int64_t stage = 0;                 // the pipeline rank these figures are for
  double parameter_count = 0;        // parameters this rank's tensor-parallel shard owns
  double parameters = 0;             // bytes; ÷dp under ZeRO-3
  double gradients = 0;              // ÷dp under ZeRO-2 and 3
  double optimizer_states = 0;       // ÷dp under ZeRO-1, 2 and 3
  double activations = 0;            // layers × micro-batches in flight (pipeline_theory.h)
  double recompute_working = 0;      // one layer rebuilt during its backward (full recompute)
  double embedding_activations = 0;  // token ids (+ dropout mask) per micro-batch in flight
  double logits = 0;                 // f32 logits (overwritten by their gradient) + final norm
  double communication_buffers = 0;  // gradient buckets, tp staging, pipeline send/recv
  double zero3_gathered = 0;         // two layers' gathered parameters (current + prefetch)
  double fragmentation = 0;          // allowance on the dynamically allocated bytes
  double total = 0;
  double capacity = 0;  // usable bytes of one device

  bool fits() const { return total <= capacity; }
};

// Model states of `parameters` parameters under ZeRO stage `zero` over `dp` ranks (Rajbhandari
// et al. 2019): parameters ÷dp from stage 3, gradients from stage 2, optimizer states from 1.
// Mixed precision (2 + 2 + 12 bytes): 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N.
struct ModelStateBytes {
  double parameters = 0;
  double gradients = 0;
  double optimizer_states = 0;
  double total() const { return parameters + gradients + optimizer_states; }
};
ModelStateBytes model_state_bytes(double parameters, int64_t dp, int zero, const StateBytes& bytes);

// Preconditions: the layout passed check_layout (evaluation.h). The most loaded stage: of the
// first and the last (runtime kMegatron), of every stage (kLattice, whose uneven partitions and
// per-schedule slots can load a middle stage most).
MemoryBreakdown estimate_memory(const TrainingSetup& setup, const Layout& layout);
// The same figures for one given pipeline rank.
MemoryBreakdown estimate_stage_memory(const TrainingSetup& setup, const Layout& layout,
                                      int64_t stage);

// Parameters pipeline rank `stage` holds in one tensor-parallel shard (before ZeRO): its
// layers, the token (and position) embedding on the first stage, the final norm and the output
// projection on the last (with tied embeddings and p > 1 the last stage keeps its own copy of
// the word embedding, as Megatron does). Column/row-parallel weights and the vocabulary divide
// by t; norms and row-parallel biases do not. `layers`: the transformer layers it holds
// (stage_layers).
double stage_parameter_count(const ModelSpec& model, const Layout& layout, int64_t stage,
                             int64_t layers);
// The part of stage_parameter_count that is experts' weights: split over tp and ep.
double stage_expert_parameter_count(const ModelSpec& model, const Layout& layout,
                                    int64_t held_layers);
// The ranks ZeRO shards a rank's dense (experts = false) or expert parameters over: the replicas
// (dp × cp), the experts' over dp / ep; Lattice's runtime shards everything over dp / ep under
// expert parallelism (parallel/zero_shards.h zero_sharding), Megatron-LM only the experts.
int64_t zero_group(const TrainingSetup& setup, const Layout& layout, bool experts);
// The p·v chunks' layer counts in model order: the layout's own layers_per_chunk; else for
// kMegatron an even split when p·v divides the layers; else (and always for kLattice) the
// runtime's balanced partition (lattice_stages.h), which gives the stages holding the embedding
// and the head fewer layers where the layers do not divide evenly.
std::vector<int64_t> chunk_layer_counts(const TrainingSetup& setup, const Layout& layout);
// The split a (pp, v) pipeline takes when none is given: empty where p·v divides the layers
// evenly (or exceeds them: check_layout rejects that), else the runtime's balanced partition.
// A search of its own: the layout search computes it once per (pp, v), evaluate() once per
// layout, and both store it in Layout::layers_per_chunk.
std::vector<int64_t> default_split(const ModelSpec& model, int64_t pp, int64_t v);
// Layers pipeline rank `stage` holds (its chunks of chunk_layer_counts).
int64_t stage_layers(const TrainingSetup& setup, const Layout& layout, int64_t stage);

}  // namespace lattice::plan
