#include "doctor/probe.h"

#include <algorithm>

#include "core/timer.h"
#include "model/parameters.h"
#include "train/train_benchmark.h"

namespace lattice::doctor {

namespace {

// A probe step of the slice takes milliseconds: a rank that does not arrive within this window
// is named at once (the config's own deadline, kept between 1 and 10 s so that a deadline
// too short for the real step — the timeouts check's finding — does not fail the probe).
constexpr double kProbeMinTimeoutS = 1.0;
constexpr double kProbeMaxTimeoutS = 10.0;

LayoutRunOptions layout_options(const TrainConfig& c, const ProbeOptions& options) {
  ParallelConfig layout = c.parallel;
  if (layout.pp == 1) layout.virtual_stages = 1;
  return {.layout = layout,
          .threads = 1,
          .warmup_steps = 0,
          .steps = options.steps,
          .collective_timeout_s =
              std::clamp(c.collective_timeout_s(), kProbeMinTimeoutS, kProbeMaxTimeoutS)};
}

}  // namespace

TrainConfig probe_config(const TrainConfig& config, int steps) {
  TrainConfig probe = config;
  const ParallelConfig& p = config.parallel;
  const int chunks = p.pp * (p.pp > 1 ? p.virtual_stages : 1);
  probe.model.n_layer = std::min<int64_t>(config.model.n_layer, std::max(2, chunks));
  probe.parallel.layers_per_chunk.clear();
  const int64_t seq = config.seq_len > 0 ? config.seq_len : config.model.seq_len;
  probe.seq_len = std::min<int64_t>(seq, 32);
  probe.micro_batch = 1;
  probe.micro_batches = p.pp > 1 ? 2 * p.pp : 1;
  probe.global_batch = 0;
  probe.resolve_batch(p.dp);
  probe.steps = steps;
  probe.threads = 1;
  probe.eval_interval = 0;
  probe.sample_tokens = 0;
  probe.out_dir.clear();
  probe.checkpoint_every = 0;
  return probe;
}

ProbeResult run_probe(const TrainConfig& config, const ProbeOptions& options) {
  Stopwatch wall;
  ProbeResult result;
  result.config = probe_config(config, options.steps);
  const TrainConfig& slice = result.config;
  const TrainingData data{
      .train = random_token_file(slice.global_batch, slice.seq_len,
                                 std::min<int64_t>(slice.model.vocab_size, kTokenFileMaxVocab),
                                 slice.seed),
      .val = nullptr};

  LayoutRunOptions layout = layout_options(slice, options);
  // Buckets of at most a quarter of the slice's store, so that backward has several to start
  // (the overlap check watches them start before it ends).
  const int64_t store_bytes =
      4 * ParameterRegistry(slice.model, {slice.parallel.tp, 0, slice.parallel.sequence_parallel})
              .total_elements();
  layout.layout.bucket_mb = std::min(layout.layout.bucket_mb,
                                     double(std::max<int64_t>(store_bytes / 4, 4096)) / (1 << 20));
  layout.data = data;
  layout.after_step = options.after_layout_step;
  result.layout = run_layout(slice, layout);
  if (!options.compare) {
    result.seconds = wall.seconds();
    return result;
  }

  if (slice.parallel.recompute != Recompute::kNone) {
    LayoutRunOptions toggled = layout;
    toggled.layout.recompute = Recompute::kNone;
    toggled.after_step = options.after_toggled_step;
    result.without_recompute = run_layout(slice, toggled);
  }

  TrainConfig one_rank = slice;
  one_rank.parallel = ParallelConfig{};
  one_rank.parallel.recompute = slice.parallel.recompute;
  one_rank.micro_batches = slice.micro_batches * slice.parallel.dp;
  one_rank.global_batch = 0;
  one_rank.resolve_batch(1);
  LayoutRunOptions single = layout_options(one_rank, options);
  single.data = data;
  result.single = run_layout(one_rank, single);
  result.seconds = wall.seconds();
  return result;
}

}  // namespace lattice::doctor
