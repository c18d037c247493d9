#include "train/trainer.h"

#include <filesystem>

#include "core/thread_budget.h"
#include "core/timer.h"
#include "train/grad_norm.h"

namespace lattice {

namespace {

std::unique_ptr<TokenLoader> open_loader(const std::filesystem::path& path,
                                         const TrainConfig& config, int64_t batch) {
  auto file = std::make_shared<const TokenFile>(path);
  TokenLoaderConfig lc;
  lc.mode = parse_sampling_mode(config.data_mode);
  lc.seed = config.seed;
  lc.batch_size = batch;
  lc.seq_len = config.seq_len;
  return std::make_unique<TokenLoader>(std::move(file), lc);
}

}  // namespace

Trainer::Trainer(TrainConfig config, Arena& arena) : config_(std::move(config)), arena_(arena) {
  config_.resolve_batch(1);
  set_thread_budget(config_.threads > 0 ? config_.threads : available_cores());

  const std::filesystem::path dir = config_.data_dir;
  if (!std::filesystem::exists(dir / "train.bin")) {
    LATTICE_THROW(ConfigError,
                  "no training data: '{}' does not exist ---> HINT: run `lattice data prepare "
                  "--input ../shared/data/tinyshakespeare.txt --out {}` or set data.dir",
                  (dir / "train.bin").string(), dir.string());
  }
  train_loader_ = open_loader(dir / "train.bin", config_, config_.global_batch);
  if (std::filesystem::exists(dir / "val.bin")) {
    TrainConfig val = config_;
    val.data_mode = "sequential";
    val_loader_ = open_loader(dir / "val.bin", val, config_.micro_batch);
  }

  model_ = std::make_unique<Transformer>(config_.model, arena_, config_.compute_dtype);
  model_->initialize(config_.seed);
  optimizer_ = std::make_unique<AdamW>(model_->parameters(), arena_, config_.adam);
  schedule_ = LrSchedule{config_.lr, config_.min_lr, config_.warmup_steps, config_.decay_steps};
  micro_ = make_token_batch(arena_, config_.micro_batch, config_.seq_len);
}

void Trainer::set_step(int64_t step) {
  step_ = step;
  optimizer_->set_steps_taken(step);
}

double Trainer::flops_per_token() const {
  const ModelConfig& c = config_.model;
  double params = double(model_->registry().total_elements());
  double attention = 12.0 * double(c.n_layer) * double(c.d_model) * double(config_.seq_len) / 2.0;
  // Causal attention does half the work of the full T×T product; PaLM counts the full one.
  return 6.0 * params + attention;
}

StepMetrics Trainer::train_step() {
  Stopwatch watch;
  ParameterStore& params = model_->parameters();
  const int64_t B = config_.micro_batch;

  // ---- training section: batch, forward, backward, clip, schedule, update ----
  params.zero_grads();
  // The loss is normalised by the global batch's token count, so every micro-batch's backward
  // is scaled by the same 1 / tokens (the loss of each micro-batch is a partial sum).
  const double global_tokens = double(config_.global_batch * config_.seq_len);
  double loss_sum = 0.0;
  for (int64_t mb = 0; mb < config_.micro_batches; ++mb) {
    train_loader_->read_batch_rows(step_, mb * B, (mb + 1) * B, micro_.inputs, micro_.targets);
    ForwardResult r = model_->forward(micro_.inputs, micro_.targets);
    loss_sum += r.loss_sum;
    model_->backward(float(1.0 / global_tokens));
  }
  const double grad_norm = std::sqrt(grad_sum_squares(params.grads()));
  grad_norm_clip(params.grads(), grad_norm, config_.grad_clip);
  const float lr = schedule_.at(step_);
  optimizer_->step(lr);
  ++step_;
  // ---- end of training section ----

  StepMetrics m;
  m.step = step_;
  m.loss = loss_sum / global_tokens;
  m.lr = lr;
  m.grad_norm = grad_norm;
  m.ms = watch.milliseconds();
  m.tokens_per_s = global_tokens / (m.ms / 1e3);
  m.model_flops_per_s = m.tokens_per_s * flops_per_token();
  return m;
}

double Trainer::evaluate() {
  LATTICE_CHECK(val_loader_ != nullptr, "evaluate() without validation data (val.bin)");
  double loss_sum = 0.0;
  int64_t tokens = 0;
  const int64_t batches = std::max<int64_t>(1, config_.eval_batches);
  for (int64_t k = 0; k < batches; ++k) {
    val_loader_->read_batch(k, micro_.inputs, micro_.targets);
    ForwardResult r = model_->forward(micro_.inputs, micro_.targets);
    loss_sum += r.loss_sum;
    tokens += r.token_count;
  }
  return loss_sum / double(std::max<int64_t>(1, tokens));
}

}  // namespace lattice
