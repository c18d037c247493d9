#include "train/trainer.h"

#include <algorithm>
#include <filesystem>

#include "core/model_flops.h"
#include "core/rank_progress.h"
#include "core/thread_budget.h"
#include "core/timer.h"
#include "model/moe_router.h"
#include "parallel/rank_sum.h"
#include "trace/event_recorder.h"
#include "train/grad_norm.h"
#include "train/pipeline_stage.h"

namespace lattice {

namespace {

std::unique_ptr<TokenLoader> make_loader(std::shared_ptr<const TokenFile> file,
                                         const TrainConfig& config, SamplingMode mode,
                                         int64_t batch) {
  // Caught here, once, rather than as an out-of-range row of the embedding mid-step.
  if (const int64_t at = file->find_token_at_least(config.model.vocab_size); at >= 0) {
    LATTICE_THROW(ConfigError,
                  "{}: token {} is id {}, outside the model's vocabulary of {} (model.vocab_size) "
                  "---> HINT: prepare the data with the tokenizer the model was configured for "
                  "(data.tokenizer = '{}'), or raise model.vocab_size",
                  file->path().string(), at, file->tokens()[size_t(at)], config.model.vocab_size,
                  config.tokenizer);
  }
  TokenLoaderConfig lc;
  lc.mode = mode;
  lc.seed = config.seed;
  lc.batch_size = batch;
  lc.seq_len = config.seq_len;
  return std::make_unique<TokenLoader>(std::move(file), lc);
}

}  // namespace

TrainingData open_training_data(const TrainConfig& config) {
  const std::filesystem::path dir = config.data_dir;
  if (!std::filesystem::exists(dir / "train.bin")) {
    LATTICE_THROW(ConfigError,
                  "no training data: '{}' does not exist ---> HINT: run `lattice data prepare "
                  "--input ../shared/data/tinyshakespeare.txt --out {}` or set data.dir",
                  (dir / "train.bin").string(), dir.string());
  }
  TrainingData data{.train = std::make_shared<const TokenFile>(dir / "train.bin"), .val = {}};
  if (std::filesystem::exists(dir / "val.bin")) {
    data.val = std::make_shared<const TokenFile>(dir / "val.bin");
  }
  return data;
}

ParallelSetup parallel_setup(const ParallelConfig& layout, DeviceMesh& mesh) {
  return {.dp = &mesh.replicas(),
          .cp = mesh.cp(),
          .ep = mesh.ep(),
          .expert_dp = mesh.ep() != nullptr ? &mesh.expert_replicas() : nullptr,
          .zero = layout.zero,
          .bucket_bytes = int64_t(layout.bucket_mb * double(1 << 20)),
          .check_replicas = layout.check_replicas,
          .tp = &mesh.tp(),
          .sequence_parallel = layout.sequence_parallel,
          .pp = &mesh.pp(),
          .embedding = mesh.embedding(),
          .schedule = layout.schedule,
          .virtual_stages = layout.virtual_stages,
          .layers_per_chunk = layout.layers_per_chunk,
          .recompute = layout.recompute};
}

Trainer::Trainer(TrainConfig config, Arena& arena, ParallelSetup parallel)
    : Trainer(config, arena, parallel, open_training_data(config)) {}

Trainer::Trainer(TrainConfig config, Arena& arena, ParallelSetup parallel, TrainingData data)
    : config_(std::move(config)), arena_(arena), parallel_(parallel) {
  LATTICE_CHECK(data.train != nullptr, "Trainer without training tokens");
  if (parallel_.cp != nullptr) {
    cp_size_ = parallel_.cp->size();
    cp_rank_ = parallel_.cp->rank();
  }
  if (parallel_.dp != nullptr) {
    LATTICE_CHECK(
        parallel_.dp->size() % cp_size_ == 0 && parallel_.dp->rank() % cp_size_ == cp_rank_,
        "group '{}' (rank {} of {}) is not the replicas of cp rank {} of {}", parallel_.dp->name(),
        parallel_.dp->rank(), parallel_.dp->size(), cp_rank_, cp_size_);
    dp_size_ = parallel_.dp->size() / cp_size_;
    dp_rank_ = parallel_.dp->rank() / cp_size_;
  }
  if (parallel_.tp != nullptr) {
    tp_size_ = parallel_.tp->size();
    tp_rank_ = parallel_.tp->rank();
  }
  if (parallel_.pp != nullptr) {
    pp_size_ = parallel_.pp->size();
    pp_rank_ = parallel_.pp->rank();
  }
  if (parallel_.zero < 0 || parallel_.zero > 3) {
    LATTICE_THROW(ConfigError,
                  "zero stage {} does not exist ---> HINT: use --zero 0 (replicated), 1 (optimizer "
                  "state sharded over dp), 2 (and gradients) or 3 (and parameters)",
                  parallel_.zero);
  }
  if (parallel_.zero >= 2 && pp_size_ > 1) {
    LATTICE_THROW(ConfigError,
                  "--zero {} with --pp {}: ZeRO-2/3 shard gradients (and parameters) per "
                  "backward, which the pipeline schedules do not drive yet ---> HINT: use --zero "
                  "1 with pipeline parallelism, or --pp 1",
                  parallel_.zero, pp_size_);
  }
  config_.resolve_batch(dp_size_);
  // Checked before anything is allocated: heads, kv heads and d_ff must split over tp; under
  // sequence parallelism so must the token rows of a micro-batch (this rank's positions under
  // context parallelism).
  validate_tensor_parallel(config_.model, {tp_size_, tp_rank_, parallel_.sequence_parallel});
  validate_context_parallel(cp_size_, config_.seq_len);
  const int ep_size = parallel_.ep != nullptr ? parallel_.ep->size() : 1;
  validate_moe_layout(config_.model, cp_size_,
                      pp_size_ > 1 && parallel_.schedule == ScheduleKind::kZeroBubbleH1, ep_size,
                      dp_size_, parallel_.zero);
  const int64_t local_seq_len = config_.seq_len / cp_size_;
  if (parallel_.sequence_parallel && (config_.micro_batch * local_seq_len) % tp_size_ != 0) {
    LATTICE_THROW(ConfigError,
                  "sequence parallelism splits the micro_batch·seq_len{} = {}·{} token rows over "
                  "--tp {}, which does not divide them ---> HINT: choose a micro-batch size or "
                  "sequence length whose product divides by {}",
                  cp_size_ > 1 ? fmt::format(" / cp {}", cp_size_) : "", config_.micro_batch,
                  local_seq_len, tp_size_, tp_size_);
  }
  ModelPart part;  // whole model
  if (pp_size_ > 1) {
    if (parallel_.schedule == ScheduleKind::kZeroBubbleH1 &&
        parallel_.recompute != Recompute::kNone) {
      LATTICE_THROW(ConfigError,
                    "schedule zb-h1 defers weight gradients, which needs every activation kept; "
                    "recompute {} drops them ---> HINT: use --recompute none with zb-h1, or "
                    "1f1b / interleaved-1f1b with recompute",
                    recompute_name(parallel_.recompute));
    }
    pipeline_schedule_ = make_schedule(parallel_.schedule, pp_size_, int(config_.micro_batches),
                                       parallel_.virtual_stages);
    const StagePartition partition = partition_model(
        config_.model, pp_size_, parallel_.virtual_stages, parallel_.layers_per_chunk);
    part = stage_part(partition, pp_size_, pp_rank_);
    LATTICE_CHECK(!config_.model.tied_embeddings || parallel_.embedding != nullptr ||
                      (!part.has_embedding() && !part.has_head()),
                  "pipeline stage {} holds the tied token table but has no embedding group",
                  pp_rank_);
    pipeline_slots_ = activation_slots(pipeline_schedule_.per_rank[size_t(pp_rank_)]);
  }
  // Ranks × threads never exceed the cores (DESIGN.md invariant 7).
  const int ranks = replica_size() * tp_size_ * pp_size_;
  const int threads = parallel_.threads > 0 ? parallel_.threads
                      : config_.threads > 0 ? config_.threads
                                            : std::max(1, available_cores() / ranks);
  set_thread_budget(threads);
  set_gemm_library(config_.gemm_library);  // process-wide; every rank sets the same one

  train_loader_ =
      make_loader(std::move(data.train), config_, config_.data_mode, config_.global_batch);
  // Once: every checkpoint and snapshot records it, and a sampled checksum reads 64 MiB.
  train_checksum_ = train_loader_->file().content_checksum();
  if (data.val) {
    val_loader_ =
        make_loader(std::move(data.val), config_, SamplingMode::kSequential, config_.micro_batch);
  }

  const ZeroSharding zero = zero_sharding(parallel_.zero, replica_size(), replica_rank(), ep_size);
  model_ = std::make_unique<Transformer>(config_.model, arena_, config_.compute_dtype,
                                         TensorParallel(parallel_.tp, parallel_.sequence_parallel),
                                         part, zero, ContextParallel(parallel_.cp),
                                         ExpertParallel(parallel_.ep));
  model_->set_recompute(parallel_.recompute);
  model_->initialize(config_.seed);  // identical on every replica: a function of the seed
  const int64_t P = model_->registry().total_elements();
  const FlatRange owned = zero.owned(P);
  optimizer_ =
      std::make_unique<AdamW>(model_->parameters(), arena_, config_.adam, owned.begin, owned.end);
  build_gradient_sync();
  schedule_ = LrSchedule{config_.lr, config_.min_lr, config_.warmup_steps, config_.decay_steps};
  micro_ = make_token_batch(arena_, config_.micro_batch, local_seq_len);
  if (cp_size_ > 1) whole_ = make_token_batch(arena_, config_.micro_batch, config_.seq_len);
  if (pp_size_ > 1) {
    runtime_ = std::make_unique<PipelineRuntime>(*parallel_.pp, arena_);
    evaluation_schedule_ = make_forward_schedule(pp_size_, 1, parallel_.virtual_stages);
    evaluation_batches_ = {micro_};
    for (int64_t mb = 0; mb < config_.micro_batches; ++mb) {
      pipeline_batches_.push_back(make_token_batch(arena_, config_.micro_batch, local_seq_len));
    }
  }
}

void Trainer::build_gradient_sync() {
  model_->set_parameter_hooks(nullptr);
  sync_.reset();  // joins its comm thread: nothing is in flight between steps
  GradientSyncOptions options{.bucket_bytes = parallel_.bucket_bytes,
                              .expert_dp = parallel_.expert_dp};
  sync_ = make_gradient_sync(parallel_.dp, model_->parameters(), arena_, options);
  model_->set_parameter_hooks(sync_->parameter_hooks());
}

void Trainer::rejoin_data_parallel(Communicator& dp) {
  if (parallel_.ep != nullptr && parallel_.ep->size() > 1) {
    LATTICE_THROW(ConfigError,
                  "rejoining a data-parallel group keeps the model, whose expert-parallel groups "
                  "would be stale ---> HINT: build the trainer anew on the new mesh and restore "
                  "it from a snapshot (what lattice launch does each generation)");
  }
  if (dp.size() != replica_size() || dp.rank() != replica_rank()) {
    LATTICE_THROW(ConfigError,
                  "rejoining the data-parallel group '{}' as rank {} of {}: this trainer is rank "
                  "{} of {}, and its shards and batch rows are laid out for that ---> HINT: a "
                  "group of another size restores the trainer from a snapshot instead",
                  dp.name(), dp.rank(), dp.size(), replica_rank(), replica_size());
  }
  parallel_.dp = &dp;
  build_gradient_sync();
}

void Trainer::read_rows(int64_t row, const TokenBatch& batch) {
  const int64_t B = config_.micro_batch;
  if (cp_size_ == 1) {
    train_loader_->read_rows(first_sequence(), row, row + B, batch.inputs, batch.targets);
    return;
  }
  train_loader_->read_rows(first_sequence(), row, row + B, whole_.inputs, whole_.targets);
  const ContextParallel& cp = model_->context_parallel();
  Tensor inputs = batch.inputs, targets = batch.targets;
  cp.take_local_positions(inputs, whole_.inputs);
  cp.take_local_positions(targets, whole_.targets);
}

void Trainer::set_step(int64_t step) {
  step_ = step;
  optimizer_->set_steps_taken(step);
}

DataPosition Trainer::data_position() const {
  // Global batch k covers sequences [k·G, (k + 1)·G) of the loader's endless stream (shifted by
  // a resume that changed G).
  const int64_t sequence = first_sequence();
  const int64_t windows = train_loader_->windows_per_epoch();
  return DataPosition{train_loader_->config().mode, train_loader_->config().seed,
                      sequence / windows, sequence % windows};
}

void Trainer::restore_data_position(const DataPosition& saved) {
  train_loader_->seek(saved);
  const int64_t sequence = saved.epoch * train_loader_->windows_per_epoch() + saved.index;
  stream_offset_ = sequence - step_ * config_.global_batch;
}

int64_t Trainer::train_tokens() const {
  return train_loader_->file().size();
}

double Trainer::flops_per_token() const {
  const ModelConfig& c = config_.model;
  // A token meets only its k experts of each layer's E: the others' weights do no work for it.
  const int64_t matrices = c.mlp == MlpKind::kSwiglu ? 3 : 2;
  const int64_t idle_experts = c.moe() ? c.n_experts - c.experts_per_token : 0;
  int64_t held_layers = 0;
  for (int64_t l = 0; l < c.n_layer; ++l) held_layers += model_->registry().part().holds_layer(l);
  const int64_t idle = held_layers * idle_experts * matrices * c.d_model * c.d_ff;
  return model_flops_per_token(model_->registry().global_elements() - idle, c.n_layer, c.d_model,
                               config_.seq_len);
}

double Trainer::run_micro_batches(double global_tokens, StepMetrics& parts) {
  const int64_t B = config_.micro_batch;
  const int64_t M = config_.micro_batches;
  double loss_sum = 0.0;
  sync_->begin_step();
  for (int64_t mb = 0; mb < M; ++mb) {
    read_rows((dp_rank_ * M + mb) * B, micro_);
    report_phase(Phase::kForward);
    TraceScope forward_scope("forward", TraceCategory::kCompute, {{"micro_batch", mb}});
    Stopwatch forward_watch;
    ForwardResult r = model_->forward(micro_.inputs, micro_.targets);
    parts.forward_ms += forward_watch.milliseconds();
    forward_scope.finish();
    loss_sum += r.loss_sum;
    router_loss_sum_ += r.router_loss_sum;
    if (mb == 0 && before_backward_) before_backward_();
    report_phase(Phase::kBackward);
    TraceScope backward_scope("backward", TraceCategory::kCompute, {{"micro_batch", mb}});
    // Gradients are synchronised as they become final, overlapping the rest of backward.
    sync_->begin_backward(mb + 1 == M);
    if (gradient_overlap_) {
      model_->set_grad_ready_hook([this](int index) { sync_->param_ready(index); });
    }
    Stopwatch backward_watch;
    model_->backward(float(1.0 / global_tokens));
    parts.backward_ms += backward_watch.milliseconds();
    model_->set_grad_ready_hook({});
    backward_scope.finish();
    sync_->end_backward();
  }
  sync_->finish();
  return loss_sum;
}

// The schedule's forwards and backwards over the pp group, then the data-parallel reduction
// (after the pipeline has drained: every stage reduces its own parameters over its dp group) and
// the tied embeddings' reduction over the embedding group. Only the last stage computes the
// loss; the sum over the pp group gives it to every stage.
double Trainer::run_pipeline(double global_tokens) {
  const int64_t B = config_.micro_batch;
  const int64_t M = config_.micro_batches;
  for (int64_t mb = 0; mb < M; ++mb) {
    read_rows((dp_rank_ * M + mb) * B, pipeline_batches_[size_t(mb)]);
  }
  ModelPipelineStage stage(*model_, pipeline_batches_, pipeline_slots_, float(1.0 / global_tokens));
  sync_->begin_step();
  if (before_backward_) before_backward_();
  pipeline_stats_ = runtime_->run(pipeline_schedule_.per_rank[size_t(pp_rank_)], stage);
  sync_->finish();
  const ParameterRegistry& registry = model_->registry();
  if (config_.model.tied_embeddings && parallel_.embedding != nullptr &&
      parallel_.embedding->size() > 1) {
    const int index =
        registry.find(config_.model.family == ModelFamily::kGpt2 ? "transformer.wte.weight"
                                                                 : "model.embed_tokens.weight");
    if (index >= 0 && (registry.part().has_embedding() || registry.at(index).tied_copy)) {
      Tensor grad = model_->parameters().grad(index);
      parallel_.embedding->all_reduce(grad, ReduceOp::kSum);
    }
  }
  // Every stage holding sparse layers adds its routers' losses.
  const std::vector<double> sums =
      sum_over_ranks(*parallel_.pp, {stage.loss_sum(), stage.router_loss_sum()});
  router_loss_sum_ = sums[1];
  return sums[0];
}

// Nothing is in flight between steps, so a group whose collectives ran slower than predicted
// (CommConfig::algorithms = kRetunedAtStepBoundary) re-measures here, on every rank at once.
// Every rank visits its groups in the same order (dp, cp, ep, the expert gradients' group, tp,
// pp, embedding), and a group communicates only when one of its windows closed, which its
// members agree on, so no rank waits on a peer that is in another group's re-measure.
void Trainer::retune_collectives() {
  const std::string when = fmt::format("after step {}", step_);
  std::vector<Communicator*> visited;
  for (Communicator* group : {parallel_.dp, parallel_.cp, parallel_.ep, parallel_.expert_dp,
                              parallel_.tp, parallel_.pp, parallel_.embedding}) {
    // Without expert parallelism the expert gradients' group is dp itself.
    if (group == nullptr || group->size() <= 1 ||
        std::find(visited.begin(), visited.end(), group) != visited.end()) {
      continue;
    }
    visited.push_back(group);
    group->retune_at_step_boundary(when);
  }
}

StepMetrics Trainer::train_step() {
  Stopwatch watch;
  TraceScope step_scope(current_event_recorder(), "step", TraceCategory::kStep,
                        {{"step", step_ + 1}});
  ParameterStore& params = model_->parameters();
  report_step(step_);

  // ---- training section: batch, forward, backward and reduce, clip, schedule, update ----
  params.zero_grads();
  // The loss is normalised by the global batch's token count, so every micro-batch's backward
  // is scaled by the same 1 / tokens (the loss of each micro-batch is a partial sum). This rank
  // reads rows [rank·M·B, (rank+1)·M·B) of global batch `step`: the same tokens for any dp.
  const double global_tokens = double(config_.global_batch * config_.seq_len);
  StepMetrics m;
  const double exposed_before = sync_->stats().exposed_seconds;
  router_loss_sum_ = 0.0;
  model_->reset_expert_counts();
  double loss_sum =
      pp_size_ > 1 ? run_pipeline(global_tokens) : run_micro_batches(global_tokens, m);
  // Over the replicas: dp ranks hold other rows, cp ranks other positions of the same rows.
  if (replica_size() > 1) {
    const std::vector<double> sums = sum_over_ranks(*parallel_.dp, {loss_sum, router_loss_sum_});
    loss_sum = sums[0];
    router_loss_sum_ = sums[1];
  }
  // Every tp rank computed the whole loss; replicated parameters' partial gradients are summed.
  model_->reduce_partial_grads();
  m.exposed_comm_ms = 1e3 * (sync_->stats().exposed_seconds - exposed_before);
  report_phase(Phase::kOptimizer);
  TraceScope update_scope(current_event_recorder(), "clip and update", TraceCategory::kOptimizer);
  Stopwatch update_watch;
  const double grad_norm =
      global_grad_norm(params, *sync_, parallel_.tp, parallel_.pp, parallel_.ep);
  const float lr = schedule_.at(step_);
  optimizer_->step(lr, clip_factor(grad_norm, config_.grad_clip));
  sync_->after_update();
  ++step_;
  if (parallel_.check_replicas) sync_->check_replicas();
  retune_collectives();
  m.optimizer_ms = update_watch.milliseconds();
  update_scope.finish();
  // ---- end of training section ----

  m.step = step_;
  m.loss = loss_sum / global_tokens;
  m.router_loss = router_loss_sum_ / global_tokens;
  record_expert_loads(m);
  m.lr = lr;
  m.grad_norm = grad_norm;
  m.ms = watch.milliseconds();
  m.tokens_per_s = global_tokens / (m.ms / 1e3);
  m.model_flops_per_s = m.tokens_per_s * flops_per_token();
  if (pp_size_ > 1) {
    m.bubble_fraction = pipeline_stats_.bubble_fraction();
    m.pipeline_compute_ms = 1e3 * pipeline_stats_.compute_seconds;
    m.pipeline_idle_ms = 1e3 * pipeline_stats_.wait_seconds;
  }
  return m;
}

void Trainer::record_expert_loads(StepMetrics& m) const {
  const ModelConfig& c = config_.model;
  if (!c.moe()) return;
  const std::vector<int64_t>& tokens = model_->expert_tokens();
  const std::vector<int64_t>& dropped = model_->expert_dropped();
  const int64_t E = c.n_experts;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!model_->registry().part().holds_layer(l)) continue;
    m.expert_layers.push_back(l);
    int64_t most = 0, total = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = tokens[size_t(l * E + e)];
      m.expert_tokens.push_back(n);
      m.expert_dropped.push_back(dropped[size_t(l * E + e)]);
      most = std::max(most, n);
      total += n;
    }
    if (total > 0) {
      m.expert_imbalance = std::max(m.expert_imbalance, double(most) * double(E) / double(total));
    }
  }
}

ForwardResult Trainer::pipeline_forward() {
  // The forward-only schedule through the same runtime as training: the stage holding chunk k
  // receives its input from the stage of chunk k − 1, runs it and sends the output on; the last
  // stage's loss goes to every stage.
  ModelPipelineStage stage(*model_, evaluation_batches_, 1, 1.0f);
  runtime_->run(evaluation_schedule_.per_rank[size_t(pp_rank_)], stage);
  const std::vector<double> sums =
      sum_over_ranks(*parallel_.pp, {stage.loss_sum(), double(stage.token_count())});
  return {sums[0], int64_t(sums[1])};
}

double Trainer::evaluate() {
  LATTICE_CHECK(val_loader_ != nullptr, "evaluate() without validation data (val.bin)");
  double loss_sum = 0.0;
  int64_t tokens = 0;
  // eval_batches × dp batches of micro_batch rows: the same validation tokens as the single-rank
  // run with the same global batch (whose micro-batch is dp times larger).
  const int64_t batches = std::max<int64_t>(1, config_.eval_batches) * dp_size_;
  for (int64_t k = 0; k < batches; ++k) {
    report_phase(Phase::kEvaluate);  // progress for the agent, batch by batch
    if (cp_size_ > 1) {
      val_loader_->read_batch(k, whole_.inputs, whole_.targets);
      model_->context_parallel().take_local_positions(micro_.inputs, whole_.inputs);
      model_->context_parallel().take_local_positions(micro_.targets, whole_.targets);
    } else {
      val_loader_->read_batch(k, micro_.inputs, micro_.targets);
    }
    ForwardResult r =
        pp_size_ > 1 ? pipeline_forward() : model_->forward(micro_.inputs, micro_.targets);
    loss_sum += r.loss_sum;
    tokens += r.token_count;
  }
  sync_->after_forward_only();
  if (cp_size_ > 1) {  // each cp rank scored its positions of the same rows
    const std::vector<double> sums = sum_over_ranks(*parallel_.cp, {loss_sum, double(tokens)});
    loss_sum = sums[0];
    tokens = int64_t(sums[1]);
  }
  return loss_sum / double(std::max<int64_t>(1, tokens));
}

}  // namespace lattice
