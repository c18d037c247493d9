// Predicted step time of one layout, and MFU and tokens/s from it.
//
// Compute: every GEMM of a layer priced at the cluster's efficiency for its shape
// (gemm_efficiency), backward 2× forward; element-wise work as memory traffic over HBM.
// Communication: tensor-parallel collectives per layer (exposed, as in Megatron), pipeline
// sends, the schedule's bubble, data-parallel reduction hidden behind the backward up to the
// runtime's overlap, ZeRO-3 gathers per micro-batch, each an α–β price on the link it crosses.
// Sparse layers: the router's GEMM, each token's k experts (balanced routing: every expert
// m = tokens·k / E rows of the rank's and its ep peers' tokens), and four all-to-alls of the
// routed rows per layer (forward dispatch and combine, both again backward).
// FLOPs convention (PaLM): model FLOPs per token 6Ψ + 12·l·h·s, Ψ the parameters a token uses
// (a sparse model's active ones); recompute counts in HFU only.
#pragma once

#include "plan/cluster_spec.h"
#include "plan/layout.h"
#include "plan/training_setup.h"

namespace lattice::plan {

// Seconds per optimizer step on the critical path (the slowest pipeline stage).
struct TimeBreakdown {
  double forward = 0;  // GEMMs + element-wise, all micro-batches
  double backward = 0;
  double recompute = 0;               // forward work the backward repeats
  double tp_communication = 0;        // per-layer all-reduces (or gathers/scatters with SP)
  double cp_communication = 0;        // context parallelism's ring hops its products do not hide
  double ep_communication = 0;        // sparse layers' all-to-alls (dispatch, combine; exposed)
  double pp_communication = 0;        // activation and gradient sends between stages
  double bubble = 0;                  // pipeline fill and drain
  double dp_communication = 0;        // exposed part of gradient reduction and parameter gathers
  double dp_communication_total = 0;  // before overlap
  double optimizer = 0;               // AdamW over this rank's shard (memory-bound)
  // Runtime kLattice: the step's small synchronising collectives (vocabulary-parallel
  // cross-entropy statistics, the embedding's all-reduce, the partial-gradient and tied-embedding
  // reductions, the global grad-norm all-reduce) and ZeRO-1's parameter broadcast, which the
  // runtime runs after the update without overlap.
  double synchronisation = 0;
  double step = 0;

  double bubble_ratio = 0;  // idle ÷ ideal compute (pipeline_theory.h)
  Transport tp_link = Transport::kIntraNode;
  Transport cp_link = Transport::kIntraNode;
  Transport dp_link = Transport::kIntraNode;
  Transport pp_link = Transport::kIntraNode;
  Transport ep_link = Transport::kIntraNode;

  double model_flops = 0;     // per step, all devices
  double hardware_flops = 0;  // including recompute
  double mfu = 0;
  double hfu = 0;
  double tokens_per_second = 0;
};

// Preconditions: the layout passed check_layout (evaluation.h).
TimeBreakdown estimate_time(const TrainingSetup& setup, const Layout& layout);

// Model FLOPs of one optimizer step (PaLM convention, 6Ψ + 12·l·h·s per token).
double model_flops_per_step(const TrainingSetup& setup);

}  // namespace lattice::plan
