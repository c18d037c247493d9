#include "plan/time_model.h"

#include <algorithm>
#include <cmath>

#include "core/model_flops.h"
#include "spec/expert_rows.h"

#include "plan/activation_memory.h"
#include "plan/collective_cost.h"
#include "plan/lattice_stages.h"
#include "plan/memory_model.h"
#include "plan/pipeline_theory.h"

namespace lattice::plan {
namespace {

// One micro-batch through one layer on one rank, seconds.
struct LayerCost {
  double forward = 0;
  double backward = 0;
  double recompute = 0;
  double tp_communication = 0;
  double cp_communication = 0;  // the ring's transfers its block products do not hide
  double ep_communication = 0;  // the sparse MLP's all-to-alls
  double recompute_flops = 0;   // per rank
};

struct Gemm {
  double m, n, k, batch;
};

double gemm_seconds(const TrainingSetup& setup, const Gemm& g) {
  double flops = 2.0 * g.m * g.n * g.k * g.batch;
  double rate = setup.cluster.peak_flops(setup.precision) *
                gemm_efficiency(setup.cluster, setup.precision, g.m, g.n, g.k) *
                setup.cluster.runtime.compute_efficiency;
  return flops / rate;
}

LayerCost layer_cost(const TrainingSetup& setup, const Layout& layout) {
  const ModelSpec& model = setup.model;
  // s: this rank's positions of a sequence; whole: all of them (context parallelism splits s).
  const double whole = double(setup.seq_len), s = whole / double(layout.cp);
  const double b = double(layout.micro_batch);
  const double h = double(model.d_model), t = double(layout.tp);
  const double tokens = b * s, heads = double(model.n_heads) / t;
  const double hd = double(model.head_dim()), kv = double(model.kv_dim());
  const double ffn = double(model.d_ff);
  const double up_width = (model.mlp == MlpKind::kSwiglu ? 2.0 : 1.0) * ffn / t;

  // Forward GEMMs of one layer on one tensor-parallel rank (shapes m×k · k×n). A sparse layer's
  // MLP: the router, then each of the rank's E/ep experts over its share of the ep group's
  // k·tokens choices (balanced: tokens·k·ep/E rows an expert). Megatron-LM runs one grouped GEMM
  // per expert; Lattice one per (source rank, expert) block, each padded (spec/expert_rows.h).
  const bool moe = model.moe();
  const double k = moe ? double(model.experts_per_token) : 1.0;
  double expert_gemms = 1.0, expert_rows = tokens;
  if (moe) {
    const double E = double(model.n_experts);
    if (setup.runtime == Runtime::kLattice) {
      expert_gemms = E;
      expert_rows = double(padded_rows(int64_t(std::ceil(tokens * k / E))));
    } else {
      expert_gemms = E / double(layout.ep);
      expert_rows = tokens * k / expert_gemms;
    }
  }
  const double mlp = gemm_seconds(setup, {expert_rows, up_width, h, expert_gemms}) +  // up
                     gemm_seconds(setup, {expert_rows, h, ffn / t, expert_gemms}) +   // down
                     (moe ? gemm_seconds(setup, {tokens, double(model.n_experts), h, 1}) : 0.0);
  const double projections = gemm_seconds(setup, {tokens, (h + 2 * kv) / t, h, 1}) +  // QKV
                             gemm_seconds(setup, {tokens, h, h / t, 1}) +             // out
                             mlp;
  // Attention core per head: scores (s×hd · hd×S) and probabilities · V (s×S · S×hd) of this
  // rank's s queries against the sequence's S keys (s = S without context parallelism, whose
  // ring balances the causal work so each rank does 1/cp of it); causal masking is not
  // discounted (PaLM convention).
  const double core = gemm_seconds(setup, {s, whole, hd, b * heads}) +
                      gemm_seconds(setup, {s, hd, whole, b * heads});
  // Element-wise work (norms, activation function, softmax, residual adds) is memory-bound:
  // each stored activation written once and read once in the forward, twice that backward.
  ActivationOptions stored{.micro_batch = layout.micro_batch,
                           .seq_len = setup.seq_len / layout.cp,
                           .tp = layout.tp,
                           .sequence_parallel = layout.sequence_parallel,
                           .recompute = Recompute::kNone,
                           .dropout = setup.dropout,
                           .flash_attention = setup.flash_attention,
                           .activation_bytes = setup.bytes().activation};
  const double elementwise =
      2.0 * layer_activation_bytes(model, stored) / setup.cluster.device.hbm_bytes_per_s;

  LayerCost cost;
  cost.forward = projections + core + elementwise + setup.cluster.runtime.layer_overhead_s;
  cost.backward = 2.0 * cost.forward;

  // Megatron's tensor parallelism: 2 all-reduces of the block output (b·s·h) forward and 2
  // backward; with SP each becomes an all-gather + reduce-scatter of the same bus volume.
  double tp_one = 0;
  if (layout.tp > 1) {
    const double bytes = setup.bytes().activation * tokens * h;
    const Transport link = tp_transport(layout, setup.cluster.gpus_per_node);
    tp_one =
        layout.sequence_parallel
            ? collective_seconds(setup.cluster, CollectiveOp::kAllGather, link, layout.tp, bytes) +
                  collective_seconds(setup.cluster, CollectiveOp::kReduceScatter, link, layout.tp,
                                     bytes)
            : collective_seconds(setup.cluster, CollectiveOp::kAllReduce, link, layout.tp, bytes);
  }
  cost.tp_communication = 4.0 * tp_one;
  if (layout.tp > 1 && layout.sequence_parallel && setup.runtime == Runtime::kMegatron) {
    // Megatron's SP keeps only its 1/t shard of each norm's output, so the backward gathers it
    // again for the weight gradients of QKV and of the MLP's first GEMM (Korthikanti et al.
    // §4.2.2). It issues the gather alongside the data-gradient GEMM, but NCCL's kernels take
    // SMs and HBM bandwidth from it; counted whole. (Lattice keeps the gathered input: its
    // backward has no such gather, docs/tensor-parallel.md.)
    const double bytes = setup.bytes().activation * tokens * h;
    cost.tp_communication +=
        2.0 * collective_seconds(setup.cluster, CollectiveOp::kAllGather,
                                 tp_transport(layout, setup.cluster.gpus_per_node), layout.tp,
                                 bytes);
  }

  // Context parallelism's ring (parallel/context_parallel.h): per layer cp − 1 hops of the
  // key/value block (both chunks, 2·b·s·kv/t elements) forward, each hidden behind its 1/cp of
  // the attention core; in the backward as many again behind 2/cp of it, and cp hops of the
  // block's gradient sums (f32 in Lattice, the activation dtype in Megatron-LM's
  // TransformerEngine): each arrives while the next block's share is computed, except the last,
  // to the block's owner, which nothing follows.
  if (layout.cp > 1) {
    const double n = double(layout.cp);
    const Transport link = cp_transport(layout, setup.cluster.gpus_per_node);
    const double block = 2.0 * b * s * kv / t;
    auto hop = [&](double bytes) {
      return collective_seconds(setup.cluster, CollectiveOp::kSendRecv, link, 2, bytes);
    };
    const double kv_hop = hop(block * setup.bytes().activation);
    const bool lattice = setup.runtime == Runtime::kLattice;
    const double grad_hop = hop(block * (lattice ? 4.0 : setup.bytes().activation));
    const double forward = (n - 1) * std::max(0.0, kv_hop - core / n);
    const double backward = (n - 1) * std::max(0.0, kv_hop - 2.0 * core / n);
    const double grads = (n - 1) * std::max(0.0, grad_hop - 2.0 * core / n) + grad_hop;
    cost.cp_communication = forward + backward + grads;
    if (layout.recompute == Recompute::kFull) cost.cp_communication += forward;
  }

  // Expert parallelism (parallel/expert_parallel.h): each sparse layer sends its k·tokens routed
  // rows to the ranks holding their experts and takes the outputs back (Lattice combines in f32),
  // and its backward runs both exchanges reversed; each after a count exchange (latency only).
  // Nothing overlaps them: the experts wait for their rows, the combine for the experts.
  if (moe && layout.ep > 1) {
    const Transport link = ep_transport(layout, setup.cluster.gpus_per_node);
    const bool lattice = setup.runtime == Runtime::kLattice;
    const double rows = tokens * k * h;
    auto exchange = [&](double bytes) {
      return collective_seconds(setup.cluster, CollectiveOp::kAllToAll, link, layout.ep, bytes) +
             collective_seconds(setup.cluster, CollectiveOp::kAllToAll, link, layout.ep,
                                8.0 * double(model.n_experts));
    };
    const double dispatch = exchange(rows * setup.bytes().activation);
    const double combine = exchange(rows * (lattice ? 4.0 : setup.bytes().activation));
    cost.ep_communication = 2.0 * (dispatch + combine);
    if (layout.recompute == Recompute::kFull) cost.ep_communication += dispatch + combine;
  }

  const double core_flops = 2.0 * 2.0 * s * whole * hd * b * heads;
  if (layout.recompute == Recompute::kSelective &&
      (!setup.flash_attention || setup.runtime == Runtime::kLattice)) {
    // The attention core's forward again (flash attention's backward rebuilds the
    // probabilities anyway, so there it adds nothing — except in Lattice, which drops the
    // attention output and its log-sum-exp and reruns the attention forward before the
    // layer's backward).
    cost.recompute = core;
    cost.recompute_flops = core_flops;
    if (!setup.flash_attention) {
      // Without a fused kernel the rerun also sweeps what surrounds the two GEMMs — the scaled
      // mask and softmax over the scores and their dropout (Korthikanti et al. §5): the bytes
      // selective recompute stops storing, written and read once, as the forward's element-wise
      // work above.
      ActivationOptions kept = stored;
      kept.recompute = Recompute::kSelective;
      const double scores =
          layer_activation_bytes(model, stored) - layer_activation_bytes(model, kept);
      cost.recompute += 2.0 * scores / setup.cluster.device.hbm_bytes_per_s;
    }
  } else if (layout.recompute == Recompute::kFull) {
    cost.recompute = cost.forward;
    cost.tp_communication += 2.0 * tp_one;  // the forward's collectives run again
    const double projection_flops =
        2.0 * tokens *
        ((h + 2 * kv) / t * h + h * h / t + k * (up_width * h + h * ffn / t) +
         (moe ? double(model.n_experts) * h : 0.0));
    cost.recompute_flops = projection_flops + core_flops;
  }
  return cost;
}

}  // namespace

double model_flops_per_step(const TrainingSetup& setup) {
  const ModelSpec& model = setup.model;
  const double per_token = model_flops_per_token(count_parameters(model).active, model.n_layers,
                                                 model.d_model, setup.seq_len);
  return per_token * double(setup.global_batch) * double(setup.seq_len);
}

TimeBreakdown estimate_time(const TrainingSetup& setup, const Layout& layout) {
  const ModelSpec& model = setup.model;
  const ClusterSpec& cluster = setup.cluster;
  const StateBytes bytes = setup.bytes();
  const int64_t m = micro_batches(layout, setup.global_batch);
  const int64_t p = layout.pp, v = layout.virtual_stages;
  // s: the positions of a sequence this rank holds (context parallelism splits them).
  const double b = double(layout.micro_batch), s = double(setup.seq_len / layout.cp);
  const double h = double(model.d_model), t = double(layout.tp);
  const double layers = double(model.n_layers) / double(p);  // the mean stage's
  const int64_t replicas = layout.replicas();

  TimeBreakdown time;
  time.tp_link = tp_transport(layout, cluster.gpus_per_node);
  time.cp_link = cp_transport(layout, cluster.gpus_per_node);
  time.dp_link = dp_transport(layout, cluster.gpus_per_node);
  time.pp_link = pp_transport(layout, cluster.gpus_per_node);
  time.ep_link = ep_transport(layout, cluster.gpus_per_node);

  const LayerCost layer = layer_cost(setup, layout);

  // The output layer and the loss on the last stage: logits GEMM (b·s × h · h × V/t) forward,
  // two GEMMs backward, and softmax over the f32 logits (written, read, overwritten).
  const double vocab_shard = double(model.padded_vocab_size) / t;
  const double output_forward = gemm_seconds(setup, {b * s, vocab_shard, h, 1}) +
                                3.0 * 4.0 * b * s * vocab_shard / cluster.device.hbm_bytes_per_s;
  // Pipeline sends: each micro-batch crosses each chunk boundary once forward (activations)
  // and once backward (their gradients); b·s·h per boundary split over the tp ranks (already
  // split under SP; without SP Megatron's scatter/gather splits it).
  double pp_per_micro_batch = 0;
  if (p > 1) {
    const double send_bytes = bytes.activation * b * s * h / t;
    pp_per_micro_batch =
        2.0 * double(v) *
        collective_seconds(cluster, CollectiveOp::kSendRecv, time.pp_link, 2, send_bytes);
    if (layout.tp > 1 && !layout.sequence_parallel && setup.runtime == Runtime::kMegatron) {
      // The scatter/gather optimisation's other half (Narayanan et al. 2021 §4.1; Megatron-LM's
      // p2p_communication gathers with gather_split_1d_tensor): each receiver all-gathers the
      // t slices of the b·s·h tensor over the tensor-parallel group's NVLink before its chunk
      // can run, forward (activations) and backward (their gradients).
      pp_per_micro_batch += 2.0 * double(v) *
                            collective_seconds(cluster, CollectiveOp::kAllGather, time.tp_link,
                                               layout.tp, bytes.activation * b * s * h);
    }
  }

  // The first and the last stage's own tensor-parallel collectives, per micro-batch: the
  // vocabulary-parallel embedding's reduction of its slice lookups (an all-reduce of N×h, a
  // reduce-scatter under SP) and, under SP, the gather of its gradient on the first stage; on
  // the last, the final norm output's gather for the column-parallel head (SP) and its
  // gradient's reduction, and the vocabulary-parallel cross-entropy's all-reduces of the row max
  // and of (Σexp, target logit) — small, so latency-bound. Megatron-LM's VocabParallelEmbedding
  // and vocab_parallel_cross_entropy run the same ones on 2-byte activations; Lattice's
  // embedding reduces in f32.
  double first_extra = 0, last_extra = 0;
  const bool lattice = setup.runtime == Runtime::kLattice;
  if (layout.tp > 1) {
    auto tp_price = [&](CollectiveOp op, double size) {
      return collective_seconds(cluster, op, time.tp_link, layout.tp, size);
    };
    const double rows = (lattice ? 4.0 : bytes.activation) * b * s * h;  // the (N, h) reduced
    const double reduce = layout.sequence_parallel ? tp_price(CollectiveOp::kReduceScatter, rows)
                                                   : tp_price(CollectiveOp::kAllReduce, rows);
    const double gather = layout.sequence_parallel ? tp_price(CollectiveOp::kAllGather, rows) : 0;
    const double gather_operand =
        layout.sequence_parallel ? tp_price(CollectiveOp::kAllGather, bytes.activation * b * s * h)
                                 : 0.0;
    first_extra = reduce + gather;
    last_extra = gather_operand + reduce + tp_price(CollectiveOp::kAllReduce, 4.0 * b * s) +
                 tp_price(CollectiveOp::kAllReduce, 8.0 * b * s);
  }

  // Per micro-batch on each stage: its layers (the partition, chunk_layer_counts), its sends,
  // the embedding's extra work on the first and the head's on the last (p = 1: one stage is
  // both). The slowest stage sets the pace; the bubble idles the mean one.
  const double per_layer = layer.forward + layer.backward + layer.recompute +
                           layer.tp_communication + layer.cp_communication + layer.ep_communication;
  const double head = 3.0 * output_forward + last_extra;
  double slowest = 0, total = 0, most_layers = 0;
  int64_t slowest_stage = 0;
  for (int64_t stage = 0; stage < p; ++stage) {
    const double held = double(stage_layers(setup, layout, stage));
    const double stage_time = held * per_layer + pp_per_micro_batch +
                              (stage == 0 ? first_extra : 0.0) + (stage == p - 1 ? head : 0.0);
    if (stage_time > slowest) slowest = stage_time, most_layers = held, slowest_stage = stage;
    total += stage_time;
  }
  const bool slowest_embeds = slowest_stage == 0, slowest_has_head = slowest_stage == p - 1;
  const double mean = total / double(p);

  const double micro = double(m);
  // The breakdown follows the slowest stage: its layers, and the embedding's or the head's work
  // where it holds them, so that the parts add up to the step.
  const double own_output = slowest_has_head ? output_forward : 0.0;
  time.forward = micro * (most_layers * layer.forward + own_output);
  time.backward = micro * (most_layers * layer.backward + 2.0 * own_output);
  time.recompute = micro * most_layers * layer.recompute;
  time.tp_communication =
      micro * (most_layers * layer.tp_communication + (slowest_embeds ? first_extra : 0.0) +
               (slowest_has_head ? last_extra : 0.0));
  time.cp_communication = micro * most_layers * layer.cp_communication;
  time.ep_communication = micro * most_layers * layer.ep_communication;
  time.pp_communication = micro * pp_per_micro_batch;
  time.bubble_ratio = bubble_ratio(layout.schedule, p, m, v);
  time.bubble = time.bubble_ratio * micro * mean;
  const double pipeline = micro * slowest + time.bubble;

  // Data-parallel reduction of this rank's shard of the most loaded stage: the dense parameters
  // over the replicas, a sparse model's experts over the ranks holding the same experts.
  double params = 0, expert_params = 0;
  for (int64_t stage = 0; stage < p; ++stage) {
    const int64_t held = stage_layers(setup, layout, stage);
    const double n = stage_parameter_count(model, layout, stage, held);
    if (n > params) params = n, expert_params = stage_expert_parameter_count(model, layout, held);
  }
  const double most_layers_backward = most_layers * (layer.backward + layer.recompute);
  const double most_layers_forward = most_layers * layer.forward;
  // Over `group` ranks: the replicas, dp × cp (context parallelism folded into data
  // parallelism), or the experts' replicas. Both kinds of buckets hide behind the same backward.
  auto reduce_over = [&](double count, int64_t group) {
    if (group <= 1 || count <= 0) return;
    const double grad_bytes = count * bytes.gradient, param_bytes = count * bytes.parameter;
    auto price = [&](CollectiveOp op, double size) {
      return collective_seconds(cluster, op, time.dp_link, group, size);
    };
    // Buckets are reduced as the backward fills them, so at most dp_overlap of the backward can
    // hide the traffic, and never the last bucket's reduction, which starts when the backward
    // ends (the overlap is partial and depends on the bucket size).
    const double last_bucket =
        std::min(grad_bytes, cluster.runtime.dp_bucket_bytes) / std::max(grad_bytes, 1.0);
    auto exposed = [&](double comm, double hide_behind) {
      return std::max(comm * last_bucket, comm - cluster.runtime.dp_overlap * hide_behind);
    };
    const double backward_mb = most_layers_backward;
    const double forward_mb = most_layers_forward;
    const double gather = price(CollectiveOp::kAllGather, param_bytes);
    const double scatter = price(CollectiveOp::kReduceScatter, grad_bytes);
    switch (layout.zero) {
      case 0: {  // one all-reduce after the last micro-batch, overlapping its backward
        const double all_reduce = price(CollectiveOp::kAllReduce, grad_bytes);
        time.dp_communication_total += all_reduce;
        time.dp_communication += exposed(all_reduce, backward_mb);
        break;
      }
      case 1:  // reduce-scatter at the end, all-gather of the updated parameters after the step
        if (lattice) {
          // Lattice all-reduces the gradients as under ZeRO-0; the owners' broadcast of the
          // updated master shards is priced with the step's synchronisation below.
          const double all_reduce = price(CollectiveOp::kAllReduce, grad_bytes);
          time.dp_communication_total += all_reduce;
          time.dp_communication += exposed(all_reduce, backward_mb);
          break;
        }
        time.dp_communication_total += scatter + gather;
        time.dp_communication += exposed(scatter, backward_mb) + exposed(gather, forward_mb);
        break;
      case 2:  // gradients are sharded: a reduce-scatter after every micro-batch
        if (lattice) {
          // Reduced to their owners per bucket during each backward; the updated master
          // shards' broadcast after the step is priced with the synchronisation below.
          time.dp_communication_total += micro * scatter;
          time.dp_communication += micro * exposed(scatter, backward_mb);
          break;
        }
        if (cluster.runtime.zero2_regathers_per_micro_batch) {
          // PyTorch FSDP's SHARD_GRAD_OP ("unshards before the forward, does not reshard them
          // after the forward, and only reshards them after the backward computation", the
          // ShardingStrategy documentation; Zhao et al. 2023 §3): between micro-batches the
          // parameters are sharded again, so each micro-batch's forward gathers them anew.
          // Llama 3 ran this (Dubey et al. 2024 §3.3.2: FSDP "shards optimizer states and
          // gradients, but for model shards we do not reshard after forward computation").
          time.dp_communication_total += micro * (scatter + gather);
          time.dp_communication +=
              micro * (exposed(scatter, backward_mb) + exposed(gather, forward_mb));
          break;
        }
        time.dp_communication_total += micro * scatter + gather;
        time.dp_communication +=
            micro * exposed(scatter, backward_mb) + exposed(gather, forward_mb);
        break;
      default:  // ZeRO-3: gather forward, gather backward, reduce-scatter, per micro-batch
        time.dp_communication_total += micro * (2.0 * gather + scatter);
        time.dp_communication +=
            micro * (exposed(gather, forward_mb) + exposed(gather + scatter, backward_mb));
        break;
    }
  };
  reduce_over(params - expert_params, replicas);
  reduce_over(expert_params, layout.expert_replicas());

  // AdamW reads gradients, reads and writes master weights and moments, writes parameters.
  const double shard = layout.zero >= 1
                           ? (params - expert_params) / double(zero_group(setup, layout, false)) +
                                 expert_params / double(zero_group(setup, layout, true))
                           : params;
  time.optimizer = shard * (2.0 * bytes.optimizer + bytes.gradient + bytes.parameter) /
                   cluster.device.hbm_bytes_per_s;

  if (lattice) {
    // The gradients are zeroed before the step and read for the global norm.
    time.optimizer += 2.0 * params * bytes.gradient / cluster.device.hbm_bytes_per_s;
    // ZeRO-1/2: after the update every owner broadcasts its f32 master shard (the volume of an
    // all-gather of the master), with nothing left to hide behind. (ZeRO-3 keeps the master
    // sharded: its gathers are per layer, above.)
    double sync = 0;
    const int64_t sharded_over = zero_group(setup, layout, false);
    if (sharded_over > 1 && (layout.zero == 1 || layout.zero == 2)) {
      const double broadcast = collective_seconds(cluster, CollectiveOp::kAllGather, time.dp_link,
                                                  sharded_over, params * 4.0);
      sync += broadcast;
      time.dp_communication_total += broadcast;
    }
    // Scalar all-reduces of every step: the loss over dp, the grad norm's sum of squares over tp,
    // pp and (ZeRO) dp.
    auto scalar = [&](Transport link, int64_t ranks) {
      return collective_seconds(cluster, CollectiveOp::kAllReduce, link, ranks, 8.0);
    };
    sync += scalar(time.dp_link, replicas) * (layout.zero >= 1 ? 2.0 : 1.0);
    sync += scalar(time.tp_link, layout.tp) + scalar(time.pp_link, layout.pp);
    // Under SP the replicated parameters' partial gradients (norms, row-parallel biases, learned
    // positions on the first stage, the final norm on the last) are summed over tp once.
    if (layout.tp > 1 && layout.sequence_parallel) {
      const ParameterCounts counts = count_parameters(model);
      double replicated = most_layers * double(counts.per_layer_replicated) +
                          double(counts.final_norm) +
                          (model.position == PositionKind::kLearned
                               ? double(model.max_seq_len) * double(model.d_model)
                               : 0.0);
      sync += collective_seconds(cluster, CollectiveOp::kAllReduce, time.tp_link, layout.tp,
                                 4.0 * replicated);
    }
    // Tied embeddings over a pipeline: the first and last stage sum the table's gradient.
    if (p > 1 && model.tied_embeddings) {
      sync += collective_seconds(cluster, CollectiveOp::kAllReduce, time.pp_link, 2,
                                 4.0 * double(model.padded_vocab_size) * h / t);
    }
    time.synchronisation = sync;
  }

  time.step = pipeline + time.dp_communication + time.synchronisation + time.optimizer;

  const double devices = double(layout.devices());
  time.model_flops = model_flops_per_step(setup);
  // Recompute work happens on every rank of every stage for every micro-batch.
  time.hardware_flops = time.model_flops + layer.recompute_flops * layers * micro * devices;
  const double peak = cluster.peak_flops(setup.precision) * devices;
  time.mfu = time.model_flops / (time.step * peak);
  time.hfu = time.hardware_flops / (time.step * peak);
  time.tokens_per_second = double(setup.global_batch) * double(setup.seq_len) / time.step;
  return time;
}

}  // namespace lattice::plan
