#include "plan/published_runs.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "plan/model_presets.h"

namespace lattice::plan {
namespace {

// A published run ran: its layout is judged on the bytes it keeps live, as `plan --validate`
// judges Lattice's own runs against the arena (validation.h), not with the 10% fragmentation
// allowance a recommendation keeps in reserve. (Llama 3's 8K-GPU layout needs it: Meta fit it
// after profiling its allocations and freeing each stage's inputs and outputs early, Dubey et
// al. 2024 §3.3.2.)
void judge_live_bytes(TrainingSetup& setup) {
  setup.cluster.runtime.fragmentation = 0;
}

// Megatron-LM's GPT models of both papers: vocabulary 51,200, sequence 2,048 (Narayanan et al.
// 2021, §5.1; Korthikanti et al. 2022, §6).
constexpr int64_t kMegatronVocab = 51200, kMegatronSeq = 2048;

ModelSpec megatron_gpt(const std::string& name, int64_t layers, int64_t heads, int64_t hidden) {
  return gpt_model(name, layers, heads, hidden, kMegatronSeq, kMegatronVocab, kMegatronVocab);
}

// Megatron-LM of 2021-22 on A100s: attention materialises the s×s scores (no flash attention
// yet), dropout is on, fp16/bf16 mixed precision (the same bytes per element). `software` names
// the codebase and how it reduced the data-parallel gradients; `dp_overlap` is that reduction's
// share of the backward it can hide behind.
TrainingSetup megatron_setup(ModelSpec model, int64_t devices, int64_t global_batch,
                             std::string software, double dp_overlap) {
  TrainingSetup setup;
  setup.model = std::move(model);
  setup.cluster = cluster_preset("dgx-a100");
  setup.cluster.runtime.software = std::move(software);
  setup.cluster.runtime.dp_overlap = dp_overlap;
  setup.devices = devices;
  setup.global_batch = global_batch;
  setup.seq_len = kMegatronSeq;
  setup.flash_attention = false;
  setup.dropout = true;
  judge_live_bytes(setup);
  return setup;
}

// How a Megatron-LM run reduced its data-parallel gradients (`--DDP-impl`).
enum class MegatronDdp {
  // PyTorch's DistributedDataParallel: 25 MiB buckets all-reduced as the backward fills them
  // (the planner's default overlap and bucket).
  kTorch,
  // Megatron's own: the whole gradient buffer all-reduced in one go after the backward
  // (per-bucket overlap came with Megatron-Core's overlap_grad_reduce in 2023).
  kLocal,
};

SearchConstraints fixed_layout(int64_t tp, int64_t pp, int64_t dp, Recompute recompute, bool sp) {
  SearchConstraints c;
  c.tp = tp;
  c.pp = pp;
  c.dp = dp;
  c.cp = 1;  // none of these runs split a sequence
  c.recompute = {recompute};
  c.sequence_parallel = sp;
  // The schedules Megatron-LM had then: 1F1B and the interleaved 1F1B (Narayanan et al. §2.2),
  // with the even splits and the pp > 2 its arguments.py required for interleaving.
  c.schedules = {Schedule::kOneFOneB, Schedule::kInterleaved1F1B};
  c.even_splits_only = true;
  c.zero_stages = {0};
  c.top_k = 1;
  return c;
}

// Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM" (SC'21), Table 1: weak scaling on Selene (DGX A100), full activation recompute.
// The step time follows from the reported teraFLOP/s per GPU and the paper's own FLOP count,
// equation (3): F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)), which counts the recompute.
// The micro-batch and the interleaving of each row are the ones NVIDIA's scripts for the paper
// ran (Megatron-LM, examples/sc21/run_table_1.sh: MBS, and --num-layers-per-virtual-pipeline-
// stage where given; none given: the plain 1F1B schedule, v = 1), and so is the gradient
// reduction (its DDP: torch for rows 1-4, local for rows 5-10). `layers_per_virtual_stage` 0:
// not interleaved. All ran the same code in the same container (examples/sc21/SRUN.sh: NGC
// PyTorch 20.12), whose GEMMs' share of the device curve published_runs() calibrates on row 1.
PublishedRun narayanan(int row, const std::string& size, int64_t heads, int64_t hidden,
                       int64_t layers, int64_t tp, int64_t pp, int64_t gpus, int64_t batch,
                       double tflops, double percent_of_peak, int64_t micro_batch,
                       int64_t layers_per_virtual_stage, MegatronDdp ddp) {
  PublishedRun run;
  run.id = fmt::format("narayanan-{}", size);
  run.source =
      fmt::format("Narayanan et al. 2021 (SC'21), Table 1, row {} ({} parameters)", row, size);
  run.step_time_from =
      "the reported teraFLOP/s per GPU and the paper's FLOP count (eq. 3, recompute included)";
  const bool torch_ddp = ddp == MegatronDdp::kTorch;
  run.setup = megatron_setup(
      megatron_gpt("gpt-" + size, layers, heads, hidden), gpus, batch,
      torch_ddp ? "megatron-lm 2021, NGC pytorch 20.12 (torch DDP: buckets overlap the backward)"
                : "megatron-lm 2021, NGC pytorch 20.12 (local DDP: all-reduce after the backward)",
      torch_ddp ? RuntimeFactors{}.dp_overlap : 0.0);
  run.layout = fixed_layout(tp, pp, gpus / (tp * pp), Recompute::kFull, false);
  run.layout.micro_batch = micro_batch;
  if (pp > 1) {
    if (layers_per_virtual_stage > 0) {
      run.layout.schedules = {Schedule::kInterleaved1F1B};
      run.layout.virtual_stages = layers / pp / layers_per_virtual_stage;
    } else {
      run.layout.schedules = {Schedule::kOneFOneB};
    }
  }
  const double B = double(batch), s = double(kMegatronSeq), l = double(layers), h = double(hidden);
  const double flops =
      96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + double(kMegatronVocab) / (16.0 * l * h));
  run.step_seconds = flops / (tflops * 1e12 * double(gpus));
  run.published_tflops_per_device = tflops;
  run.published_hfu = percent_of_peak / 100.0;  // the paper's FLOPs count the recompute
  return run;
}

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
// (MLSys'23), Table 3 (configurations) and Table 5 (end-to-end iteration time): full recompute
// without sequence parallelism, and selective recompute with sequence parallelism ("present
// work"); data parallelism 1.
std::vector<PublishedRun> korthikanti(const std::string& size, int64_t heads, int64_t hidden,
                                      int64_t layers, int64_t pp, int64_t gpus, int64_t batch,
                                      int64_t micro_batch, double full_seconds,
                                      double selective_seconds, double selective_mfu) {
  std::vector<PublishedRun> runs;
  for (bool selective : {false, true}) {
    PublishedRun run;
    run.id = fmt::format("korthikanti-{}-{}", size, selective ? "selective-sp" : "full");
    run.source = fmt::format(
        "Korthikanti et al. 2022, Tables 3 and 5, {} model, '{}' column", size,
        selective ? "present work (selective recompute + sequence parallelism)" : "full recompute");
    run.step_time_from = "published (seconds per iteration)";
    // dp 1: no gradient reduction to overlap (Megatron-LM's default DDP then was still local).
    run.setup = megatron_setup(megatron_gpt("gpt-" + size, layers, heads, hidden), gpus, batch,
                               "megatron-lm 2022 (local DDP: all-reduce after the backward)", 0.0);
    run.layout =
        fixed_layout(8, pp, 1, selective ? Recompute::kSelective : Recompute::kFull, selective);
    run.layout.micro_batch = micro_batch;
    run.step_seconds = selective ? selective_seconds : full_seconds;
    run.published_mfu = selective ? selective_mfu : 0;
    runs.push_back(std::move(run));
  }
  return runs;
}

// Dubey et al. 2024, "The Llama 3 Herd of Models", §3.3.2 and Table 4: Llama 3 405B on H100s,
// tp 8, pp 16, 16M tokens per step at 8,192 tokens, bf16, FSDP over the data-parallel group
// (ZeRO-2, below), no recompute named. §3.3.2: "we use an interleaved schedule ... with V
// pipeline stages on one pipeline rank", and "we reduce one Transformer layer each from the first
// and the last stages. This means that the first model chunk on the first stage has only the
// embedding, and the last model chunk on the last stage has only output projection and loss
// calculation": one layer fewer empties a chunk, so a chunk is one layer and V = 128 / 16 = 8
// (128 chunk slots, the first and the last empty). The step time follows from the reported
// TFLOPs per GPU and the PaLM FLOP convention (6Ψ + 12·l·h·s per token): §3.3.2 reports "BF16
// Model FLOPs Utilization (MFU; Chowdhery et al. (2023))", and Table 4's TFLOPs ÷ 989 are its
// MFUs. Row 3 is the long-context stage: 131,072 tokens, each sequence over a
// context-parallel group of 16 (§3.3.2; Meta's cp all-gathers the keys and values where
// Lattice's ring passes them on, the same bytes), 16M tokens per step.
PublishedRun llama3(int row, int64_t gpus, int64_t dp, double tflops, double mfu,
                    int64_t seq_len = 8192, int64_t cp = 1) {
  PublishedRun run;
  run.id = cp > 1 ? fmt::format("llama3-405b-{}k-context", seq_len / 1024)
                  : fmt::format("llama3-405b-{}k-gpus", gpus / 1024);
  run.source = fmt::format("Dubey et al. 2024 (The Llama 3 Herd of Models), Table 4, row {}", row);
  run.step_time_from =
      "the reported TFLOPs per GPU and the PaLM FLOP convention (6Ψ + 12·l·h·s per token)";
  TrainingSetup& setup = run.setup;
  setup.model = model_preset("llama-3-405b");
  setup.cluster = cluster_preset("dgx-h100");
  setup.devices = gpus;
  setup.global_batch = 2048 * 8192 / seq_len;  // 16M tokens
  setup.seq_len = seq_len;
  judge_live_bytes(setup);
  SearchConstraints& c = run.layout;
  c.tp = 8;
  c.pp = 16;
  c.dp = dp;
  c.cp = cp;
  c.recompute = {Recompute::kNone};
  c.schedules = {Schedule::kInterleaved1F1B};
  c.virtual_stages = 8;
  // §3.3.2: "Our use of FSDP for Llama 3 shards optimizer states and gradients, but for model
  // shards we do not reshard after forward computation": ZeRO-2.
  c.zero_stages = {2};
  // That FSDP is PyTorch's (§3.3.2 cites Zhao et al. 2023) with SHARD_GRAD_OP's resharding after
  // each backward: a parameter all-gather every micro-batch, not once a step.
  setup.cluster.runtime.software =
      "pytorch fsdp shard_grad_op (parameters gathered per micro-batch)";
  setup.cluster.runtime.zero2_regathers_per_micro_batch = true;
  // Meta's split: 126 one-layer chunks between an embedding-only first and a head-only last.
  c.layers_per_chunk.assign(128, 1);
  c.layers_per_chunk.front() = c.layers_per_chunk.back() = 0;
  c.top_k = 1;
  run.step_seconds = model_flops_per_step(setup) / (tflops * 1e12 * double(gpus));
  run.published_tflops_per_device = tflops;
  run.published_mfu = mfu;
  return run;
}

}  // namespace

std::vector<PublishedRun> published_runs() {
  constexpr MegatronDdp torch = MegatronDdp::kTorch, local = MegatronDdp::kLocal;
  std::vector<PublishedRun> runs = {
      // ..., teraFLOP/s per GPU, % of peak, then run_table_1.sh's MBS, layers per virtual
      // stage and DDP.
      narayanan(1, "1.7b", 24, 2304, 24, 1, 1, 32, 512, 137, 44, 16, 0, torch),
      narayanan(2, "3.6b", 32, 3072, 30, 2, 1, 64, 512, 138, 44, 16, 0, torch),
      narayanan(3, "7.5b", 32, 4096, 36, 4, 1, 128, 512, 142, 46, 16, 0, torch),
      narayanan(4, "18.4b", 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 8, 0, torch),
      narayanan(5, "39.1b", 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 4, 0, local),
      narayanan(6, "76.1b", 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 2, 5, local),
      narayanan(7, "145.6b", 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 2, 5, local),
      narayanan(8, "310.1b", 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 1, 3, local),
      narayanan(9, "529.6b", 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 1, 1, local),
      narayanan(10, "1008b", 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 1, 0, local),
  };
  // One codebase, one container, one share of the device's GEMM curve for all ten rows. Korthikanti
  // et al.'s rows a year later (Megatron-LM 2022) reach the full curve; the 2021 code did not
  // (one curve cannot fit two codebases). Row 1 measures it: tp 1, pp 1, one micro-batch, its
  // gradient all-reduce hidden behind the backward by PyTorch's DDP, so its step is the GEMMs
  // and the memory sweeps of one GPU; the other nine rows, with tp 2-8, pp 1-64 and dp 6-128,
  // check the rest of the model at that efficiency.
  runs.front().calibration = true;
  const double efficiency = software_efficiency_of(runs.front());
  for (PublishedRun& run : runs) {
    run.setup.cluster.runtime.compute_efficiency = efficiency;
    run.setup.cluster.runtime.compute_efficiency_from = runs.front().id;
  }
  for (auto& group : {korthikanti("22b", 64, 6144, 48, 1, 8, 4, 4, 1.42, 1.10, 0.415),
                      korthikanti("175b", 96, 12288, 96, 8, 64, 64, 1, 18.13, 13.75, 0.514),
                      korthikanti("530b", 128, 20480, 105, 35, 280, 280, 1, 49.05, 37.83, 0.560),
                      korthikanti("1t", 160, 25600, 128, 64, 512, 512, 1, 94.42, 71.49, 0.563)}) {
    runs.insert(runs.end(), group.begin(), group.end());
  }
  runs.push_back(llama3(1, 8192, 64, 430, 0.43));
  runs.push_back(llama3(2, 16384, 128, 400, 0.41));
  runs.push_back(llama3(3, 16384, 8, 380, 0.38, 131072, 16));
  return runs;
}

double software_efficiency_of(const PublishedRun& run) {
  auto predicted = [&](double efficiency) {
    PublishedRun at = run;
    at.setup.cluster.runtime.compute_efficiency = efficiency;
    const SearchResult result = search_layouts(at.setup, at.layout);
    LATTICE_CHECK(!result.ranked.empty(), "published run {} does not fit", run.id);
    return result.ranked.front().time.step;
  };
  // The step time falls as the efficiency rises: bisect between a floor far too slow and the
  // whole curve.
  double slow = 0.05, fast = 1.0;
  if (predicted(fast) >= run.step_seconds) return fast;
  if (predicted(slow) <= run.step_seconds) return slow;
  for (int i = 0; i < 40; ++i) {
    const double mid = 0.5 * (slow + fast);
    (predicted(mid) > run.step_seconds ? slow : fast) = mid;
  }
  return 0.5 * (slow + fast);
}

double PublishedCheck::predicted_seconds() const {
  return fits() ? search.ranked.front().time.step : 0.0;
}

double PublishedCheck::error() const {
  return fits() ? (predicted_seconds() - run.step_seconds) / run.step_seconds : 0.0;
}

PublishedValidation validate_published(const std::vector<PublishedRun>& runs) {
  PublishedValidation v;
  double sum = 0;
  for (const PublishedRun& run : runs) {
    PublishedCheck check{.run = run, .search = search_layouts(run.setup, run.layout)};
    if (check.fits()) ++v.accepted;
    if (check.fits() && !run.calibration) {
      ++v.judged;
      const double e = std::abs(check.error());
      sum += e;
      if (e >= v.max_abs_error) {
        v.max_abs_error = e;
        v.worst = run.id;
      }
    }
    v.checks.push_back(std::move(check));
  }
  if (v.judged > 0) v.mean_abs_error = sum / double(v.judged);
  return v;
}

}  // namespace lattice::plan
