// `lattice explain CONFIG [train's layout flags: --tp N --sp --dp N --zero 0|1|2|3 --pp P
// --schedule KIND --virtual-stages V ...] [--micro-batches M] [--rank R] [--set key=value ...]`:
// prints, before anything
// runs and without allocating the model, what one rank holds and sends (DESIGN.md invariant 2):
// the layout, its parameter table, the activations of one micro-batch, the ordered
// tensor-parallel collectives of one forward and backward, and with --pp the stage's layers
// (train/pipeline_stage.h's partition), the pipeline schedule as a grid and each stage's
// activation memory. The tables come from model/model_description.h, tested equal to what the
// model allocates and records when it runs. A layout the model cannot take is a ConfigError
// (exit 3). The layout is resolved as `lattice train` resolves it (resolve_layout_config): the
// config's [parallel] section, then the flags given over it.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/layout_flags.h"
#include "cli/validators.h"
#include "core/error.h"
#include "model/model_description.h"
#include "model/moe_router.h"
#include "parallel/device_mesh.h"
#include "parallel/zero_shards.h"
#include "spec/pipeline_schedule.h"
#include "spec/schedule_grid.h"
#include "train/pipeline_stage.h"
#include "train/train_config.h"

namespace lattice::cli {

namespace {

struct ExplainArgs {
  std::string config;
  std::vector<std::string> overrides;
  LayoutFlags layout;     // --dp, --tp, --sp, --pp, --schedule, ... over the config's [parallel]
  int micro_batches = 0;  // 0: the config's batch.micro_batches
  int rank = 0;
};

std::string bytes_text(int64_t bytes) {
  const double b = double(bytes);
  if (bytes < (int64_t(1) << 10)) return fmt::format("{} B", bytes);
  if (bytes < (int64_t(1) << 20)) return fmt::format("{:.1f} KiB", b / 1024.0);
  if (bytes < (int64_t(1) << 30)) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024.0));
  return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0));
}

std::string shape_text(const Shape& shape) {
  return shape.to_string();
}

// Characters of UTF-8 text (labels such as "Σexp"): fmt pads by characters, not bytes.
size_t text_width(const std::string& text) {
  return size_t(std::count_if(text.begin(), text.end(), [](char ch) {
    return (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  }));
}

// Columns padded to their widest cell; the last column is not padded.
void print_table(const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = text_width(header[c]);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], text_width(row[c]));
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line = " ";
    for (size_t c = 0; c < row.size(); ++c) {
      line += c + 1 < row.size() ? fmt::format(" {:<{}} ", row[c], width[c]) : " " + row[c];
      if (c + 1 < row.size()) line += "|";
    }
    fmt::print("{}\n", line);
  };
  print_row(header);
  size_t total = 1;
  for (size_t w : width) total += w + 3;
  fmt::print(" {}\n", std::string(total, '-'));
  for (const auto& row : rows) print_row(row);
}

void print_parameters(const ParameterTable& table, int rank, int tp_rank, int tp,
                      const std::string& zero_note) {
  fmt::print("\nparameters on rank {} (tp rank {} of {}):\n", rank, tp_rank, tp);
  std::vector<std::vector<std::string>> rows;
  for (const ParameterRow& p : table.rows) {
    rows.push_back({p.name, shape_text(p.global_shape), shape_text(p.local_shape), p.shard, p.dtype,
                    bytes_text(p.bytes)});
  }
  print_table({"name", "global shape", "local shape", "shard", "dtype", "bytes"}, rows);
  fmt::print(
      "  {} parameters in the model, {} on this rank ({} in its flat store, 16-element aligned)\n"
      "  parameters {} | gradients {} (of which {} elements summed over tp once per step) | "
      "optimizer state (AdamW m, v) {}{}\n",
      table.global_elements, table.local_elements, table.store_elements,
      bytes_text(table.parameter_bytes), bytes_text(table.gradient_bytes),
      table.partial_grad_elements, bytes_text(table.optimizer_bytes), zero_note);
}

void print_activations(const ActivationTable& table, const RankWorkload& w, int rank, int cp) {
  fmt::print("\nactivations of one micro-batch (B={}, T={}{}: {} token rows) on rank {}:\n",
             w.micro_batch, w.tokens() / w.micro_batch,
             cp > 1 ? fmt::format(" of each sequence's {}, context parallel: the shapes are this "
                                  "rank's positions",
                                  cp * w.tokens() / w.micro_batch)
                    : "",
             w.tokens(), rank);
  std::vector<std::vector<std::string>> rows;
  for (const ActivationRow& a : table.rows) {
    rows.push_back({a.name, shape_text(a.global_shape), shape_text(a.local_shape), a.split,
                    std::string(dtype_name(a.dtype)), bytes_text(a.bytes)});
  }
  print_table({"name", "global shape", "local shape", "split", "dtype", "bytes"}, rows);
  fmt::print(
      "  per micro-batch in flight {} | scratch shared by all micro-batches {} | total {} ({} "
      "buffers)\n",
      bytes_text(table.slot_bytes), bytes_text(table.scratch_bytes), bytes_text(table.total_bytes),
      table.rows.size());
}

std::string phase_of(const CollectiveRecord& r) {
  if (r.what.ends_with("(fwd)") || r.what.starts_with("logits")) return "forward";
  if (r.what.ends_with("(bwd)")) return "backward";
  return "step";
}

void print_collectives(const std::vector<CollectiveRecord>& records, const ParallelConfig& layout) {
  if (layout.tp == 1) {
    fmt::print(
        "\ntensor-parallel collectives: none (tp = 1; the model's {} calls on a group of one "
        "communicate nothing)\n",
        records.size());
    return;
  }
  fmt::print(
      "\ntensor-parallel collectives of one micro-batch's forward and backward{}, in order "
      "(group tp, {} ranks{}; sizes are the full buffer):\n",
      layout.pp > 1 ? " on this stage" : "", layout.tp,
      layout.sequence_parallel ? ", sequence parallel" : "");
  std::vector<std::vector<std::string>> rows;
  struct OpTotal {
    int calls = 0;
    int64_t bytes = 0;
  };
  std::map<std::string, OpTotal> per_op;
  int64_t micro_batch_bytes = 0, step_bytes = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const CollectiveRecord& r = records[i];
    const std::string phase = phase_of(r);
    rows.push_back({fmt::format("{}", i), phase, r.op, r.what, "tp", fmt::format("{}", r.elements),
                    std::string(dtype_name(r.dtype)), bytes_text(collective_bytes(r))});
    per_op[r.op].calls += 1;
    per_op[r.op].bytes += collective_bytes(r);
    (phase == "step" ? step_bytes : micro_batch_bytes) += collective_bytes(r);
  }
  print_table({"#", "phase", "op", "what", "group", "elements", "dtype", "bytes"}, rows);
  for (const auto& [op, total] : per_op) {
    fmt::print("  {:<15} {:>4} call{} {:>12}\n", op, total.calls, total.calls == 1 ? " " : "s",
               bytes_text(total.bytes));
  }
  fmt::print("  per micro-batch {} | once per step (after the last backward) {}\n",
             bytes_text(micro_batch_bytes), bytes_text(step_bytes));
}

// Every sparse layer's experts on this rank and the exchanges that carry its tokens to them
// (parallel/expert_parallel.h, in the order Transformer::moe_forward / moe_backward run them).
void print_experts(const ParallelConfig& layout, const RankWorkload& w, const MeshCoordinates& at) {
  const ModelConfig& m = w.model;
  if (!m.moe()) return;
  const int64_t E = m.n_experts, first = w.ep.first(E), count = w.ep.count(E);
  const int64_t rows = max_padded_rows(w.tokens() * m.experts_per_token, E);
  const std::string cdt(dtype_name(w.compute_dtype));
  fmt::print(
      "\nmixture of experts: every layer routes its {} tokens to {} of {} experts (packed rows, "
      "at most {} with padding); this rank holds experts [{}, {}) of each layer\n",
      w.tokens(), m.experts_per_token, E, rows, first, first + count);
  if (layout.ep <= 1) {
    fmt::print(
        "  no expert parallelism: the rows stay on this rank; expert gradients are summed over "
        "dp like the others\n");
    return;
  }
  const int block = at.dp / layout.ep * layout.ep;
  const std::string group =
      fmt::format("ep[pp{}·tp{}·dp{}-{}]", at.pp, at.tp, block, block + layout.ep - 1);
  const std::string replicas = fmt::format("edp[pp{}·tp{}·ep{}]", at.pp, at.tp, at.dp % layout.ep);
  fmt::print(
      "  per layer on {} ({} ranks), in order:\n"
      "    forward   all_to_all  rows per (source, expert)   i32, {} per peer\n"
      "    forward   all_to_all  dispatch: the rows          {} x C={}, counts per peer, at most "
      "{} rows sent\n"
      "    forward   all_to_all  combine: the experts' out   f32 x C, the same counts reversed\n"
      "    backward  all_to_all  grad of the experts' out    {} x C, dispatch's counts\n"
      "    backward  all_to_all  grad of the rows            f32 x C, combine's counts\n"
      "  expert gradients: all_reduce over {} ({} ranks holding the same experts); dense "
      "gradients over dp ({} ranks)\n",
      group, layout.ep, count, cdt, m.d_model, rows, cdt, replicas, layout.dp / layout.ep,
      layout.dp);
}

// Every layer's attention under context parallelism: the hops of its ring on this rank, the
// block products at each, and what goes over the cp group (ring_schedule, the order the ring
// runs them in).
void print_ring(const ParallelConfig& layout, int rank, const RankWorkload& w,
                const MeshCoordinates& at) {
  if (layout.cp == 1) return;
  const int n = layout.cp, r = at.cp;
  const int64_t c = w.seq_len / 2;  // the rank's local positions are two chunks of c
  const int64_t kv_heads = ParameterRegistry(w.model, w.tp, w.part).heads().kv_heads;
  const int64_t block_elements = 4 * w.micro_batch * c * kv_heads * w.model.head_size();
  const DType dtype = w.compute_dtype;
  const int64_t block_bytes = block_elements * int64_t(dtype_size(dtype));
  const int64_t grad_bytes = block_elements * int64_t(sizeof(float));
  fmt::print(
      "\ncontext-parallel ring of every layer's attention (group cp, {} ranks): rank {} holds "
      "chunks {} and {} of {} (positions [{}, {}) and [{}, {})); each hop sends the key/value "
      "block in hand to cp rank {} while its products run, and receives the next from cp rank "
      "{}:\n",
      n, rank, r, 2 * n - 1 - r, 2 * n, r * c, (r + 1) * c, (2 * n - 1 - r) * c, (2 * n - r) * c,
      (r + 1) % n, (r + n - 1) % n);
  std::vector<std::vector<std::string>> rows;
  double work = 0;
  for (const RingHop& hop : ring_schedule(n, r)) {
    std::vector<std::string> products;
    for (const RingPair& p : hop.pairs) {
      products.push_back(
          fmt::format("q{}×kv{} {}", p.query_id, p.key_id, p.causal ? "causal" : "whole"));
      work += p.causal ? 0.5 : 1.0;
    }
    const bool sends = hop.hop + 1 < n;
    rows.push_back({fmt::format("{}", hop.hop), fmt::format("cp rank {}", hop.source),
                    fmt::format("{}", fmt::join(products, ", ")),
                    sends ? bytes_text(block_bytes) : "-", bytes_text(grad_bytes)});
  }
  print_table({"hop", "block of", "products (forward and backward)", "fwd/bwd send", "dk,dv send"},
              rows);
  const int64_t per_layer = 2 * (n - 1) * block_bytes + n * grad_bytes;
  fmt::print(
      "  {:.1f} of the {} chunk products of a layer's causal attention (the same on every rank: "
      "causal balance) | per "
      "layer and micro-batch: {} forward + {} backward hops of {} ({}), {} hops of f32 "
      "gradients ({}): {} sent | × {} layers: {}\n",
      work, 2 * n * n, n - 1, n - 1, bytes_text(block_bytes), dtype_name(dtype), n,
      bytes_text(grad_bytes), bytes_text(per_layer), w.model.n_layer,
      bytes_text(per_layer * w.model.n_layer));
}

std::string part_text(const ModelPart& part) {
  std::string text;
  for (size_t c = 0; c < part.chunks.size(); ++c) {
    const LayerChunk& k = part.chunks[c];
    text += fmt::format("{}chunk {}: layers [{}, {}){}{}", c == 0 ? "" : "; ", c, k.first_layer,
                        k.last_layer, k.embedding ? " + embedding" : "",
                        k.head ? " + final norm, head and loss" : "");
  }
  return text;
}

// The schedule grid, then each stage's layers and activation memory: the trainer keeps one
// activation slot per micro-batch in flight at the stage's peak, plus one shared scratch.
void print_schedule(const ParallelConfig& layout, const RankWorkload& rank_workload,
                    const std::vector<ModelPart>& stage_parts, int micro_batches) {
  const Schedule schedule =
      make_schedule(layout.schedule, layout.pp, micro_batches, layout.virtual_stages);
  const Timeline timeline = simulate(schedule);
  fmt::print("\npipeline schedule (unit costs: forward 1, backward-input 1, backward-weight 1):\n");
  // The grid ends with the peak in-flight micro-batches per stage (peak_in_flight) and the
  // bubble fraction.
  fmt::print("{}", render_schedule_grid(schedule, timeline));
  const std::vector<int> peak = peak_in_flight(schedule);
  fmt::print("\nactivation memory per stage (tp rank {}):\n", rank_workload.tp.rank);
  for (int stage = 0; stage < layout.pp; ++stage) {
    RankWorkload w = rank_workload;
    w.part = stage_parts[size_t(stage)];
    const ActivationTable acts = activation_table(w);
    const int slots = std::max(1, peak[size_t(stage)]);
    fmt::print("  stage {}: {} slot(s) × {} + scratch {} = {} | {}\n", stage, slots,
               bytes_text(acts.slot_bytes), bytes_text(acts.scratch_bytes),
               bytes_text(slots * acts.slot_bytes + acts.scratch_bytes), part_text(w.part));
  }
}

void run_explain(const ExplainArgs& args, const CLI::App& cmd) {
  // The layout `lattice train` would run: the config, then the layout flags over it.
  TrainConfig config = resolve_layout_config(args.config, args.overrides, cmd, args.layout);
  const ParallelConfig& layout = config.parallel;
  const MeshShape mesh{
      .pp = layout.pp, .dp = layout.dp, .tp = layout.tp, .cp = layout.cp, .ep = layout.ep};
  validate_mesh(mesh, mesh.world_size());
  validate_context_parallel(layout.cp, config.seq_len);
  validate_moe_layout(config.model, layout.cp, false, layout.ep, layout.dp,
                      std::max(layout.zero, 0));
  if (args.rank < 0 || args.rank >= mesh.world_size()) {
    LATTICE_THROW(ConfigError,
                  "--rank {} is outside the {} ranks of {} ---> HINT: give a rank in [0, {})",
                  args.rank, mesh.world_size(), mesh.to_string(), mesh.world_size());
  }
  const MeshCoordinates at = mesh_coordinates(mesh, args.rank);
  // --micro-batches is batch.micro_batches: the global batch follows (or must agree).
  if (args.micro_batches > 0) config.micro_batches = args.micro_batches;
  config.resolve_batch(layout.dp);
  const int micro_batches = int(config.micro_batches);
  const bool pipeline = layout.pp > 1 || layout.virtual_stages > 1;

  // Under context parallelism a rank holds seq_len / cp positions of each sequence.
  RankWorkload w{config.model,
                 {layout.tp, at.tp, layout.sequence_parallel},
                 config.micro_batch,
                 config.seq_len / layout.cp,
                 config.compute_dtype};
  w.recompute = layout.recompute;
  w.ep = {layout.ep, at.dp % layout.ep};
  w.context_parallel = layout.cp > 1;
  // Zero-bubble schedules split backward: the weight gradients' inputs wait in the slot.
  w.deferred_weights = pipeline && layout.schedule == ScheduleKind::kZeroBubbleH1;
  // Every description first: a layout the model cannot take fails before anything is printed.
  std::vector<ModelPart> stage_parts;
  if (pipeline) {
    const StagePartition partition =
        partition_model(config.model, layout.pp, layout.virtual_stages, layout.layers_per_chunk);
    for (int stage = 0; stage < layout.pp; ++stage) {
      stage_parts.push_back(stage_part(partition, layout.pp, stage));
    }
    w.part = stage_parts[size_t(at.pp)];
  }
  ParameterTable params = parameter_table(w);
  // ZeRO shards over the replicas: dp, or dp × cp under context parallelism (the trainer's
  // replica rank dp · cp + cp).
  const int replicas = layout.dp * layout.cp, replica = at.dp * layout.cp + at.cp;
  std::string zero_note = replicas > 1 ? " (ZeRO 0: every dp replica holds all of it)" : "";
  // Under expert parallelism ZeRO shards over the dp / ep ranks holding the same experts.
  const ZeroSharding sharding = zero_sharding(layout.zero, replicas, replica, layout.ep);
  if (layout.zero >= 1 && sharding.ranks > 1) {
    // What the stage shards, as the ParameterStore allocates it on this replica.
    params = parameter_table(w, sharding);
    const bool master = layout.zero >= 3 || config.compute_dtype != DType::kF32;
    zero_note =
        fmt::format(" (ZeRO {}: {} rank {}'s shard of {} for {})", layout.zero,
                    layout.ep > 1   ? "expert-replica"
                    : layout.cp > 1 ? "dp·cp"
                                    : "dp",
                    sharding.rank, sharding.ranks,
                    layout.zero >= 3 ? "the optimizer state, gradients and parameters"
                    : layout.zero == 2
                        ? (master ? "the optimizer state, f32 master and gradients"
                                  : "the optimizer state and gradients")
                        : (master ? "the optimizer state and f32 master" : "the optimizer state"));
  }
  const ActivationTable acts = activation_table(w);
  const std::vector<CollectiveRecord> collectives = tensor_parallel_collectives(w);

  const ModelConfig& m = config.model;
  fmt::print(
      "lattice explain: {} ({}, {} layers, C={}, {} heads / {} kv heads, F={}, V={}) | {}\n",
      m.name, family_name(m.family), m.n_layer, m.d_model, m.n_head, m.n_kv_head, m.d_ff,
      m.vocab_size,
      config.compute_dtype == DType::kF32 ? "fp32" : "bf16 compute, fp32 master and gradients");
  fmt::print(
      "layout: {} = {} ranks (tp fastest){} | rank {} is {} | global batch {} = micro-batch {} × "
      "{} micro-batches × dp {}, T={}\n",
      mesh.to_string(), mesh.world_size(),
      layout.sequence_parallel && layout.tp > 1 ? ", sequence parallel" : "", args.rank,
      at.to_string(), config.global_batch, config.micro_batch, config.micro_batches, layout.dp,
      config.seq_len);
  if (pipeline) fmt::print("pipeline stage {} holds {}\n", at.pp, part_text(w.part));
  print_parameters(params, args.rank, at.tp, layout.tp, zero_note);
  print_activations(acts, w, args.rank, layout.cp);
  print_collectives(collectives, layout);
  print_ring(layout, args.rank, w, at);
  print_experts(layout, w, at);
  if (pipeline) print_schedule(layout, w, stage_parts, micro_batches);
}

}  // namespace

void register_explain_command(CLI::App& app) {
  auto args = std::make_shared<ExplainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "explain", "Print what each rank holds and sends for a layout, before anything runs");
  cmd->add_option("config", args->config, "The train TOML config (see configs/)")->required();
  cmd->add_option("--set", args->overrides, "Override a config key: section.key=value")
      ->allow_extra_args(false);
  add_layout_flags(*cmd, args->layout);
  cmd->add_option("--micro-batches", args->micro_batches,
                  "Micro-batches per step (overrides batch.micro_batches)")
      ->check(positive_number());
  cmd->add_option("--rank", args->rank, "The world rank to describe (default 0)")
      ->check(non_negative_number());
  cmd->callback([args, cmd] { run_explain(*args, *cmd); });
}

}  // namespace lattice::cli
