// The training configuration: a TOML file (toml++) plus `--set key=value` overrides.
//
// Every key is known: an unknown key or a value of the wrong type is a ConfigError naming the
// key and, for a misspelling, the nearest valid key. Keys are `section.name`; the sections are
// model, data, batch, optim, train, eval, sample, output, parallel (see configs/*.toml and docs/).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/comm_types.h"
#include "core/dtype.h"
#include "data/data_position.h"
#include "kernels/adamw.h"
#include "kernels/matmul.h"
#include "model/config.h"
#include "spec/model_kinds.h"
#include "spec/pipeline_schedule.h"

namespace lattice {

// The [parallel] section: the rank layout of `lattice train` (docs/data-parallel.md). A
// `lattice train` flag given on the command line (--dp, --tp, --sp, --zero, --bucket-mb,
// --transport, --check-replicas) overrides the key of the same name.
struct ParallelConfig {
  int dp = 1;  // data-parallel ranks
  int tp = 1;  // tensor-parallel ranks (tp fastest in the mesh)
  int cp = 1;  // context-parallel ranks: each sequence split (after tp)
  // Expert parallelism (docs/moe.md): each sparse layer's experts spread over groups of ep
  // consecutive dp ranks, tokens sent to their experts' ranks and back by all-to-all.
  int ep = 1;
  bool sequence_parallel = false;  // key "sp": split the residual stream's rows over tp
  int zero = 0;                    // ZeRO stage 0-3 (what each shards: parallel/zero_shards.h)
  double bucket_mb = 1.0;          // gradient bucket size (dp > 1)
  // threads (in-process ranks) | mpi (under mpirun) | gloo (under lattice launch)
  TransportKind transport = TransportKind::kThreads;
  bool check_replicas = false;  // hash and compare the dp replicas after every step
  int pp = 1;                   // pipeline stages (docs/pipeline-parallel.md)
  ScheduleKind schedule = ScheduleKind::kOneFOneB;  // gpipe | 1f1b | interleaved-1f1b | zb-h1
  int virtual_stages = 1;                  // model chunks per stage (interleaved-1f1b: ≥ 2)
  Recompute recompute = Recompute::kNone;  // none | selective | full
  std::vector<int> layers_per_chunk = {};  // pipeline chunks' layer counts; empty: the cost model
  // Deadline of every collective, seconds; 0: 30 s. Under `lattice launch` a backstop above
  // elastic.progress_timeout_s: the agent finds a failed rank before any deadline passes.
  double timeout_s = 0.0;
  // Collective algorithms (docs/comm.md "The tuner on the training path"): false: the
  // cheapest per message size under the cost model, re-measured and switched at a step boundary
  // when a size runs persistently slower than predicted; true: ring everywhere, so two runs of
  // one layout agree bit for bit whatever the timing.
  bool deterministic = false;
  // The alpha-beta models the tuner prices algorithms with (`lattice bench comm --calibrate
  // FILE`); empty: the analytic default.
  std::string comm_profile = {};

  int world_size() const { return dp * cp * tp * pp; }
};

// The [elastic] section: liveness and snapshots of a run under `lattice launch`
// (docs/elastic.md). The timeouts form a ladder checked at start (check_timeout_ladder):
// heartbeat interval < heartbeat timeout <= progress timeout < collective deadline.
// The share of the collective deadline after which a rank without progress is stuck at the
// latest (elastic/agent.h, stuck_limit_s): its peers, waiting in a collective, time out later.
inline constexpr double kStuckShareOfDeadline = 0.5;

struct ElasticConfig {
  double heartbeat_interval_s = 0.1;
  double heartbeat_timeout_s = 1.0;  // no heartbeat for this long: the rank is dead or stopped
  // Heartbeat but no progress for this long at least: stuck. The limit grows with the rank's
  // own pace (stuck_limit_s, elastic/agent.h): progress_factor times the longest it went
  // without progress in the steps it finished, up to half the collective deadline.
  double progress_timeout_s = 2.0;
  double progress_factor = 4.0;
  int64_t snapshot_every = 1;  // in-memory snapshot every N steps; 0: none
  // A rank whose compute per step (outside collectives) exceeds this many times the median of
  // the others' for 3 steps in a row is reported as a straggler (not killed); 0: never.
  double straggler_factor = 1.5;
};

struct TrainConfig {
  ModelConfig model = model_preset("gpt2-tiny");

  // data: a directory holding train.bin and val.bin (written by `lattice data prepare`).
  std::string data_dir = "runs/data/shakespeare-char";
  SamplingMode data_mode = SamplingMode::kSequential;  // sequential | shuffled
  std::string tokenizer = "byte";                      // a name make_tokenizer knows

  // batch: global_batch = micro_batch × micro_batches × dp (sequences); any two determine
  // the third (0 = derive).
  int64_t micro_batch = 0;
  int64_t micro_batches = 0;
  int64_t global_batch = 0;
  int64_t seq_len = 0;  // 0: the model's seq_len

  // optim
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // 0: the number of steps
  AdamWHyper adam{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  float grad_clip = 1.0f;  // 0: no clipping

  // train
  int64_t steps = 100;
  DType compute_dtype = DType::kF32;  // "fp32" | "bf16" (bf16 compute, fp32 master weights)
  // "onednn" | "mkl": the library every matmul of the run calls (kernels/matmul.h).
  GemmLibrary gemm_library = GemmLibrary::kOneDnn;
  uint64_t seed = 1337;
  int threads = 0;  // per rank; 0: all available cores
  int64_t log_interval = 1;

  // eval: validation loss every `interval` steps (and at the end) over `batches` batches.
  int64_t eval_interval = 0;  // 0: only at the end
  int64_t eval_batches = 20;

  // sample: text generated at the end of training (0 tokens: none).
  int64_t sample_tokens = 0;
  float sample_temperature = 1.0f;
  std::string sample_prompt = "\n";
  uint64_t sample_seed = 42;

  // output
  std::string out_dir;  // final checkpoint goes to out_dir/final; empty: no checkpoint
  // Checkpoints every N steps into out_dir/checkpoints/step_N (0: none), keeping the newest
  // keep_last; `lattice train --resume auto` continues from the newest valid one.
  int64_t checkpoint_every = 0;
  int64_t keep_last = 3;
  // Periodic checkpoints snapshot in memory and write on a background thread (--ckpt-async).
  bool checkpoint_async = false;

  ParallelConfig parallel;
  ElasticConfig elastic;
  // The deadline of every collective: parallel.timeout_s, or its default for the transport.
  double collective_timeout_s() const;
  // ConfigError naming the keys when the elastic timeouts are out of order.
  void check_timeout_ladder() const;

  // Derives the missing one of (micro_batch, micro_batches, global_batch) for `dp` data-parallel
  // ranks, or throws ConfigError showing the formula when they are inconsistent or indivisible.
  void resolve_batch(int64_t dp = 1);
  int64_t tokens_per_step() const { return global_batch * seq_len; }
  // Refits the layout to a world of `world` ranks (an elastic run that lost ranks): tp and pp
  // stay, dp becomes world / (tp·pp), and the global batch is kept by more micro-batches per
  // rank (the largest micro-batch up to the old one that divides the rank's rows); expert
  // parallelism takes the largest ep up to the old one dividing the new dp and the experts.
  // ConfigError
  // naming the constraint and the world sizes that would keep it when none does.
  void refit_to_world(int world);
  // The world sizes up to this layout's that refit_to_world accepts (tp·pp times each dp that
  // divides the global batch), ascending.
  std::vector<int> refittable_worlds() const;
};

// Reads a TOML file, then applies overrides "section.key=value" in order.
TrainConfig load_train_config(const std::filesystem::path& path,
                              const std::vector<std::string>& overrides = {});
// The same from TOML text (tests); `source` names it in errors.
TrainConfig parse_train_config(std::string_view toml_text, std::string_view source,
                               const std::vector<std::string>& overrides = {});
// Every valid key, "section.name".
std::vector<std::string> train_config_keys();
// The valid key closest to `key` by edit distance (for "did you mean" hints).
std::string nearest_key(std::string_view key, const std::vector<std::string>& keys);

}  // namespace lattice
