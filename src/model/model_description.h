// What one rank of a tensor-parallel layout holds and sends, described without building anything
// (`lattice explain`, DESIGN.md invariant 2: the data flow is drawn, not guessed).
//
// Pure functions of (model, tensor-parallel layout, micro-batch B, T, compute dtype, and the
// pipeline part, recompute and deferred weight gradients the rank runs with): no communicator, no
// arena, nothing allocated beyond the returned rows. Each mirrors the code that
// really does the work and is tested against it:
//   - parameter_table: the ParameterRegistry's specs and the ParameterStore's buffers;
//   - activation_table: Transformer's activation slot and scratch (its arena's live activation
//     bytes after a forward and backward equal the table's total);
//   - tensor_parallel_collectives: the TensorParallel log of one forward, one backward and
//     reduce_partial_grads, record for record.
// When Transformer changes which buffers or collectives it uses, these change with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "model/config.h"
#include "model/parameters.h"
#include "model/transformer.h"
#include "parallel/tensor_parallel.h"

namespace lattice {

// One rank's view of one micro-batch: the inputs every description is a function of.
struct RankWorkload {
  ModelConfig model;
  TensorParallelLayout tp;
  int64_t micro_batch = 1;  // B
  int64_t seq_len = 0;      // T; 0: model.seq_len
  DType compute_dtype = DType::kF32;
  // The layers this rank holds (a pipeline stage's chunks); empty: the whole model.
  ModelPart part{};
  Recompute recompute = Recompute::kNone;  // Transformer::set_recompute
  // Zero-bubble schedules' deferred weight gradients (backward_chunk(..., defer_weights)).
  bool deferred_weights = false;
  // Expert parallelism: which share of each sparse layer's experts the rank holds.
  ExpertLayout ep{};
  // Context parallelism (cp > 1): the ring passes k and v between ranks, so GPT-2's q, k and v
  // are split out of the fused projection into buffers of their own (Transformer::
  // attention_reads_qkv).
  bool context_parallel = false;

  int64_t tokens() const { return micro_batch * (seq_len > 0 ? seq_len : model.seq_len); }
};

struct ParameterRow {
  std::string name;  // global name
  Shape global_shape;
  Shape local_shape;  // as stored on this rank (vocabulary padding included)
  // ShardSpec::describe(), plus "; partial grad: summed over tp" for ParameterSpec::partial_grad
  // and "; tied copy: grad summed over the embedding group" for ParameterSpec::tied_copy.
  std::string shard;
  std::string dtype;  // "f32", or "f32 master + bf16 compute"
  int64_t bytes = 0;  // master (+ compute copy) of the local shape on this rank
};

struct ParameterTable {
  std::vector<ParameterRow> rows;
  int64_t global_elements = 0;  // ParameterRegistry::global_elements(): tied copies not counted
  int64_t local_elements = 0;   // Σ local shapes on this rank
  // The rank's buffers as the ParameterStore and Transformer allocate them: flat stores keep
  // every parameter 16-element aligned, so these count that padding.
  int64_t store_elements = 0;         // ParameterRegistry::total_elements()
  int64_t parameter_bytes = 0;        // f32 master (+ bf16 compute copy)
  int64_t gradient_bytes = 0;         // f32 gradients + the packed buffer of partial gradients
  int64_t partial_grad_elements = 0;  // summed over tp once per step (reduce_partial_grads)
  // AdamW moments (m and v, f32) of `optimizer_elements` (the whole store without ZeRO).
  int64_t optimizer_elements = 0;
  int64_t optimizer_bytes = 0;
};

// optimizer_elements: the elements whose moments this rank keeps (< 0: the whole store).
// ConfigError (validate_tensor_parallel) when the model does not split over the layout.
ParameterTable parameter_table(const RankWorkload& workload, int64_t optimizer_elements = -1);
// The bytes as the ParameterStore and AdamW allocate them on rank zero.rank of a dp group of
// zero.ranks at ZeRO stage zero.stage (model/parameters.h): the sharded master, compute copy,
// f32 copies, gradients and moments; ZeRO-2/3's lent buckets and gathered layers are transient
// and not counted.
ParameterTable parameter_table(const RankWorkload& workload, const ZeroSharding& zero);

struct ActivationRow {
  std::string name;  // "layer 0 ln_1", "logits", "grad ln (reduced)"
  Shape global_shape;
  Shape local_shape;
  // "replicated", "heads", "hidden (d_ff)", "token rows (sp)", "vocab", "partial sums"
  std::string split;
  DType dtype = DType::kF32;
  int64_t bytes = 0;  // of the local shape
};

struct ActivationTable {
  // The micro-batch's slot first, then the scratch.
  std::vector<ActivationRow> rows;
  // Kept per micro-batch in flight (Transformer's activation slot): what forward writes and
  // backward reads. A pipeline stage holds one slot per micro-batch in flight.
  int64_t slot_bytes = 0;
  // Shared by every micro-batch in flight: a layer's row-parallel output, backward's working
  // buffers and, with recompute, the recomputed layer's buffers.
  int64_t scratch_bytes = 0;
  int64_t total_bytes = 0;  // one slot + the scratch
};

// The activations and backward scratch of one training micro-batch (forward with targets).
// ConfigError when sequence parallelism cannot split the B·T token rows over tp, T exceeds the
// model's seq_len, or deferred weight gradients meet recompute (the Transformer refuses the pair).
ActivationTable activation_table(const RankWorkload& workload);

// The ordered collectives of one forward (with targets), one backward and reduce_partial_grads,
// exactly as Transformer records them in TensorParallel::log(). With tp = 1 the Transformer still
// records its (no-op) all-reduces; they are listed too, so the equality holds for every layout.
// For a part of several chunks: the forward of each chunk in local order, then the backward of
// each in reverse local order (a pipeline schedule interleaves them; each chunk's own list is
// what it issues).
std::vector<CollectiveRecord> tensor_parallel_collectives(const RankWorkload& workload);

// Bytes a collective moves as nccl-tests and CollectiveRecord count them: the full buffer.
int64_t collective_bytes(const CollectiveRecord& record);

}  // namespace lattice
