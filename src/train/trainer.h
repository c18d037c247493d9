// One rank's training: the model, its optimizer and the data, and the step that ties them.
//
// A step reads top to bottom (train_step): the global batch of this step, forward and backward
// over its micro-batches, the global gradient norm and clipping, the learning rate of the
// schedule, the AdamW update. The loss of a step is the sum of token losses over the global
// batch divided by its token count (DESIGN.md invariant 1), never a mean of micro-batch means.
// Under data parallelism (ParallelSetup) each rank trains its rows of the global batch and
// the gradients are summed over the dp group in buckets that overlap backward
// (docs/data-parallel.md); the step then reads the same on every rank.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "comm/communicator.h"
#include "core/arena.h"
#include "data/token_loader.h"
#include "data_parallel/gradient_sync.h"
#include "model/transformer.h"
#include "parallel/device_mesh.h"
#include "parallel/pipeline_runtime.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/train_config.h"

namespace lattice {

struct StepMetrics {
  int64_t step = 0;  // 1-based: the number of updates done after this step
  double loss = 0.0;
  // Mixture of experts: the routers' losses (balance and z), trained on with the loss above and
  // reported apart from it (0 for a dense model).
  double router_loss = 0.0;
  // Mixture of experts, this rank's share of the step: for each sparse layer it holds
  // (expert_layers), the tokens each expert received and the choices a capacity dropped, E per
  // layer in layer order; expert_imbalance: the largest max / mean of a layer's loads (1:
  // balanced, E: one expert takes every token).
  std::vector<int64_t> expert_layers;
  std::vector<int64_t> expert_tokens, expert_dropped;
  double expert_imbalance = 0.0;
  float lr = 0.0f;
  double grad_norm = 0.0;  // before clipping
  double ms = 0.0;
  // The training loop's wall time for this step (run_training): ms plus what followed it before
  // the step was logged, a snapshot, a checkpoint's stall, an evaluation. 0 outside the loop.
  double loop_ms = 0.0;
  // Of loop_ms, the in-memory snapshot's part under lattice launch: the snapshot of the step
  // before, written at the boundary after that step's line (0: none).
  double snapshot_ms = 0.0;
  double tokens_per_s = 0.0;
  double model_flops_per_s = 0.0;
  std::optional<double> val_loss;
  // Pipeline runs: this stage's share of the step not spent computing (its bubble and waits).
  std::optional<double> bubble_fraction;
  // Where this rank's step went, ms: forward and backward compute (a pipeline stage: its
  // instructions' compute, forwards and backwards together, in pipeline_compute_ms), the clip
  // and update, the wait for data-parallel gradients that backward did not hide, and a pipeline
  // stage's time blocked in transfers.
  double forward_ms = 0.0;
  double backward_ms = 0.0;
  double pipeline_compute_ms = 0.0;
  double optimizer_ms = 0.0;
  double exposed_comm_ms = 0.0;
  double pipeline_idle_ms = 0.0;
  // The step without its waits for gradients and transfers: where a slow rank shows (the wall
  // time is the same on every rank, they wait for each other).
  double busy_ms() const { return ms - exposed_comm_ms - pipeline_idle_ms; }
};

// The parallel layout of one rank: its data-parallel group (docs/data-parallel.md) and its
// tensor-parallel group (docs/tensor-parallel.md); nullptr or a group of one: not split that way.
struct ParallelSetup {
  // The group this rank's gradients are summed over and its ZeRO shards laid out over: the dp
  // group, or under context parallelism the dp × cp group of replicas (DeviceMesh::replicas).
  Communicator* dp = nullptr;
  // Context parallelism (parallel/context_parallel.h): the cp group each sequence is split over;
  // its ranks are consecutive in `dp` (rank = dp coordinate · cp + cp coordinate).
  Communicator* cp = nullptr;
  // Expert parallelism: the group a sparse layer's experts are spread over (nullptr: every rank
  // holds them all), and the group its experts' gradients are summed over (the dp group's ranks
  // holding the same experts; nullptr: dp).
  Communicator* ep = nullptr;
  Communicator* expert_dp = nullptr;
  // ZeRO stage over dp (parallel/zero_shards.h): 0 replicated; 1 AdamW moments sharded; 2 also
  // the gradients; 3 also the parameters (pp = 1 only).
  int zero = 0;
  int64_t bucket_bytes = 1 << 20;  // gradient bucket size (f32 bytes)
  bool check_replicas = false;     // hash and compare the parameters after every step
  int threads = 0;                 // per rank; 0: cores / (dp · tp) (never oversubscribe)
  Communicator* tp = nullptr;
  bool sequence_parallel = false;  // split the residual stream's token rows over tp
  // Pipeline parallelism (docs/pipeline-parallel.md): the pp group (rank = stage), the
  // embedding group (first and last stage: tied embeddings), the schedule and its chunks.
  Communicator* pp = nullptr;
  Communicator* embedding = nullptr;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  int virtual_stages = 1;
  std::vector<int> layers_per_chunk = {};  // empty: balanced by the cost model
  Recompute recompute = Recompute::kNone;  // activation recompute (model/transformer.h)
};

// The token files a Trainer reads: the training file, and the validation file or none.
struct TrainingData {
  std::shared_ptr<const TokenFile> train;
  std::shared_ptr<const TokenFile> val;
};

// data_dir/train.bin and data_dir/val.bin (val optional) of `config`. ConfigError naming the
// missing file and the command that makes it; IoError for a file that is not a token file.
TrainingData open_training_data(const TrainConfig& config);

// The setup of a rank of `mesh` for the config's [parallel] layout: its groups, ZeRO stage,
// buckets, schedule and recompute.
ParallelSetup parallel_setup(const ParallelConfig& layout, DeviceMesh& mesh);

class Trainer {
 public:
  // Reads open_training_data(config), builds and initialises the model from config.seed.
  // With a dp group, every rank of it constructs a Trainer with the same config; the batch is
  // resolved for dp ranks (global_batch = micro_batch × micro_batches × dp).
  Trainer(TrainConfig config, Arena& arena, ParallelSetup parallel = {});
  // The same on tokens of the caller's (benchmarks and probes: tokens in memory). ConfigError
  // when a token lies outside the model's vocabulary.
  Trainer(TrainConfig config, Arena& arena, ParallelSetup parallel, TrainingData data);

  StepMetrics train_step();
  // Mean token loss over eval_batches batches of the validation file (sequential from its
  // start, so every evaluation sees the same tokens). Requires val.bin.
  double evaluate();
  bool has_validation() const { return val_loader_ != nullptr; }

  const TrainConfig& config() const { return config_; }
  int dp_size() const { return dp_size_; }  // the batch's split (dp coordinate, not cp)
  int dp_rank() const { return dp_rank_; }
  int cp_size() const { return cp_size_; }
  // The ranks holding this rank's parameters (dp × cp), and this one's place among them: what
  // ZeRO shards and checkpoints are laid out over.
  int replica_size() const { return dp_size_ * cp_size_; }
  int replica_rank() const { return dp_rank_ * cp_size_ + cp_rank_; }
  int tp_size() const { return tp_size_; }
  int pp_size() const { return pp_size_; }
  // The pipeline schedule of a pp > 1 run, and what the last step measured on this stage.
  const Schedule& pipeline_schedule() const { return pipeline_schedule_; }
  const PipelineStepStats& pipeline_stats() const { return pipeline_stats_; }
  const ParallelSetup& parallel() const { return parallel_; }
  // What the data-parallel gradient synchronisation measured (all zero without a dp group).
  GradientSyncStats gradient_sync_stats() const { return sync_->stats(); }
  // Continues on a new dp group with every rank in its place (an elastic generation that
  // replaced a rank): the gradient synchronisation is rebuilt over it, the model and optimizer
  // state kept. Call between steps, on every rank of the new group.
  void rejoin_data_parallel(Communicator& dp);
  // Called once per step just before its first backward (a pipeline stage: before its
  // schedule): the elastic snapshot's write of the step before must be done by then, so that a
  // fault later in the step loses that step only (docs/elastic.md). Empty: nothing.
  void set_before_backward(std::function<void()> hook) { before_backward_ = std::move(hook); }
  // Off: backward reports no gradient ready, so every bucket is reduced after it ends (ZeRO-0/1:
  // GradReducer launches the rest at finish) — the baseline of the overlap, and the broken
  // hook lattice doctor's overlap check must name. On by default.
  void set_gradient_overlap(bool on) { gradient_overlap_ = on; }
  Transformer& model() { return *model_; }
  AdamW& optimizer() { return *optimizer_; }
  int64_t step() const { return step_; }  // updates done so far
  void set_step(int64_t step);            // resume: the next step trains on batch `step`
  // Where the next step's global batch starts in the training data (for checkpoints).
  DataPosition data_position() const;
  // Resume: the next step's global batch starts where `saved` says, through the loader's
  // checked seek (ConfigError for another sampling mode or seed, or an index outside this
  // file's epoch) — also under another global batch, which then reads on from there.
  void restore_data_position(const DataPosition& saved);
  int64_t train_tokens() const;  // the training file's token count
  // Its TokenFile::content_checksum, computed once at construction.
  uint32_t train_checksum() const { return train_checksum_; }
  // Model FLOPs per trained token (core/model_flops.h: PaLM appendix B, as bench and plan).
  double flops_per_token() const;

 private:
  TrainConfig config_;
  Arena& arena_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<TokenLoader> train_loader_;
  std::unique_ptr<TokenLoader> val_loader_;
  uint32_t train_checksum_ = 0;
  ParallelSetup parallel_;
  int dp_size_ = 1, dp_rank_ = 0;
  int cp_size_ = 1, cp_rank_ = 0;
  int tp_size_ = 1, tp_rank_ = 0;
  int pp_size_ = 1, pp_rank_ = 0;
  double router_loss_sum_ = 0.0;  // this step's, summed as the step goes (mixture of experts)
  Schedule pipeline_schedule_;
  std::unique_ptr<PipelineRuntime> runtime_;
  std::vector<TokenBatch> pipeline_batches_;  // (micro_batches): alive until their backward
  int pipeline_slots_ = 1;
  PipelineStepStats pipeline_stats_;
  Schedule evaluation_schedule_;                // forwards only, one micro-batch
  std::vector<TokenBatch> evaluation_batches_;  // {micro_}: the batch evaluate() reads into
  std::unique_ptr<GradientSync> sync_;
  std::function<void()> before_backward_;
  bool gradient_overlap_ = true;  // over parallel_.dp, for the store's ZeRO stage
  LrSchedule schedule_;
  TokenBatch micro_;  // (micro_batch, T / cp): the positions this rank trains on
  TokenBatch whole_;  // (micro_batch, T) under context parallelism: the rows as read
  int64_t step_ = 0;
  // Batch k starts at sequence k·global_batch + stream_offset_ (0 unless a resume moved it).
  int64_t stream_offset_ = 0;
  int64_t first_sequence() const { return step_ * config_.global_batch + stream_offset_; }

  // Forward and backward of the step's micro-batches; returns this rank's loss sum and adds
  // their compute times to `parts`.
  double run_micro_batches(double global_tokens, StepMetrics& parts);
  // Rows [row, row + B) of the step's global batch into `batch`: this rank's chunks of them
  // under context parallelism.
  void read_rows(int64_t row, const TokenBatch& batch);
  double run_pipeline(double global_tokens);
  // The loss sum and token count of micro_ through the pipeline's forwards only (evaluation).
  ForwardResult pipeline_forward();
  void retune_collectives();
  // Mixture of experts: this step's expert loads into m (StepMetrics::expert_tokens).
  void record_expert_loads(StepMetrics& m) const;
  // The synchroniser of parallel_.dp for the store's ZeRO stage, its hooks set on the model.
  void build_gradient_sync();
};

}  // namespace lattice
