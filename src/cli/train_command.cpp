// `lattice train CONFIG.toml [--set key=value ...] [--metrics FILE] [--dp N --zero 0|1 ...]
// [--tp N [--sp]] [--transport threads|mpi]`: trains with a progress line per step, validation
// every eval.interval steps, a final checkpoint and, if sample.tokens > 0, sampled text at the
// end. The ranks form a dp × tp mesh (tp fastest) on in-process threads or, under mpirun, on MPI
// (docs/data-parallel.md, docs/tensor-parallel.md); every rank evaluates and samples in step,
// world rank 0 alone prints, writes metrics and checkpoints.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>

#include "ckpt/checkpoint.h"
#include "cli/commands.h"
#include "comm/launch.h"
#include "core/cpu_peak.h"
#include "core/thread_budget.h"
#include "core/timer.h"
#include "data/tokenizer.h"
#include "model/generate.h"
#include "parallel/device_mesh.h"
#include "train/metrics_log.h"
#include "train/trainer.h"

namespace lattice::cli {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string metrics;
  std::string init_from;
  int dp = 1;
  int tp = 1;
  bool sp = false;
  std::string transport = "threads";
  int zero = 0;
  double bucket_mb = 1.0;
  bool check_replicas = false;
  std::string resume;  // a checkpoint directory, or "auto": the newest valid under out_dir
};

// The checkpoint a --resume argument names: "auto" is the newest valid step_N under
// out_dir/checkpoints (none: a fresh start), anything else a checkpoint directory.
std::optional<std::filesystem::path> resume_dir(const std::string& resume,
                                                const TrainConfig& config) {
  if (resume.empty()) return std::nullopt;
  if (resume != "auto") return std::filesystem::path(resume);
  if (config.out_dir.empty()) {
    LATTICE_THROW(ConfigError,
                  "--resume auto looks under output.dir, which is empty ---> HINT: set output.dir "
                  "or pass a checkpoint directory to --resume");
  }
  std::optional<ResumeChoice> choice =
      resume_auto(std::filesystem::path(config.out_dir) / "checkpoints");
  if (!choice) return std::nullopt;
  return choice->dir;
}

void save_step_checkpoint(Trainer& trainer, const TrainConfig& config) {
  TrainingState state{.step = trainer.step(),
                      .lr_step = trainer.step(),
                      .data = trainer.data_position(),
                      .seed = config.seed};
  CommitOptions commit;
  commit.keep_last = int(config.keep_last);
  std::filesystem::path dir =
      save_training_checkpoint(std::filesystem::path(config.out_dir) / "checkpoints", config,
                               trainer.model(), trainer.optimizer(), state, commit);
  fmt::print("checkpoint {} committed\n", dir.string());
}

void print_summary(Trainer& trainer, const TrainConfig& config, int64_t first_step,
                   double train_seconds, std::optional<double> last_val);

// One rank's training loop on its mesh.
void train_rank(const TrainArgs& args, const TrainConfig& loaded, DeviceMesh& mesh) {
  Stopwatch wall;
  const bool lead = mesh.world().rank() == 0;
  Arena arena(fmt::format("rank{}", mesh.world().rank()));
  ParallelSetup parallel{.dp = &mesh.dp(),
                         .zero = args.zero,
                         .bucket_bytes = int64_t(args.bucket_mb * double(1 << 20)),
                         .check_replicas = args.check_replicas,
                         .tp = &mesh.tp(),
                         .sequence_parallel = args.sp};
  Trainer trainer(loaded, arena, parallel);
  const TrainConfig& config = trainer.config();  // with the batch resolved
  if (!args.init_from.empty()) {
    load_hf_weights(args.init_from, trainer.model());
    if (lead) fmt::print("initialised from {}\n", args.init_from);
  }

  if (std::optional<std::filesystem::path> dir = resume_dir(args.resume, config)) {
    TrainingState state = load_training_checkpoint(*dir, trainer.model(), trainer.optimizer());
    trainer.set_step(state.step);
    if (lead) fmt::print("resumed from {} at step {}\n", dir->string(), state.step);
  } else if (lead && !args.resume.empty()) {
    fmt::print("no checkpoint to resume from: starting at step 0\n");
  }

  const int threads = thread_budget();
  const int world = mesh.world().size();
  const double peak = measured_fp32_peak_flops_per_thread() * threads * world;
  if (lead) {
    fmt::print(
        "lattice train: {} ({} parameters) | {} | global batch {} = {} x {} micro-batches x dp {} "
        "of T={} ({} tokens) | {} steps | mesh {} on {}: {} rank(s) x {} thread(s){}{}, fp32 "
        "peak {:.1f} GFLOP/s\n",
        config.model.name, trainer.model().registry().global_elements(),
        config.compute_dtype == DType::kBF16 ? "bf16 compute, fp32 master" : "fp32",
        config.global_batch, config.micro_batch, config.micro_batches, args.dp, config.seq_len,
        config.tokens_per_step(), config.steps, mesh.shape().to_string(), args.transport, world,
        threads,
        args.dp > 1 ? fmt::format(", zero {}, buckets of {} MB", args.zero, args.bucket_mb) : "",
        args.tp > 1 ? fmt::format(", tensor parallel{}", args.sp ? " + sequence parallel" : "")
                    : "",
        peak / 1e9);
  }

  std::optional<MetricsLog> metrics;
  if (lead && !args.metrics.empty()) metrics.emplace(args.metrics);
  std::optional<double> last_val;
  const int64_t first_step = trainer.step();
  for (int64_t s = first_step; s < config.steps; ++s) {
    StepMetrics m = trainer.train_step();
    const bool last = m.step == config.steps;
    const bool eval_due =
        trainer.has_validation() &&
        ((config.eval_interval > 0 && m.step % config.eval_interval == 0) || last);
    // Every replica evaluates (they hold the same weights), so no rank idles in the next step's
    // collectives for the length of an evaluation, however long it takes.
    if (eval_due) last_val = m.val_loss = trainer.evaluate();
    if (config.checkpoint_every > 0 && m.step % config.checkpoint_every == 0 && !last && lead) {
      // Replicas hold identical weights and moments (ZeRO-0, tp 1), so rank 0 writes for all;
      // the others wait for it in the next step's collectives.
      save_step_checkpoint(trainer, config);
    }
    if (!lead) continue;
    if (m.step % config.log_interval == 0 || eval_due || last || m.step == 1) {
      fmt::print("{}\n", format_progress(m, config.steps, peak));
      std::fflush(stdout);
    }
    if (metrics) metrics->write(m, peak);
  }
  const double train_seconds = wall.seconds();
  // Every tp rank takes part in sampling (the logits are split by vocabulary); dp replicas other
  // than the first do not.
  if (config.sample_tokens > 0 && mesh.coordinates().dp == 0) {
    auto tokenizer = make_tokenizer(config.tokenizer);
    SampleOptions options{config.sample_tokens, config.sample_temperature, config.sample_seed};
    std::vector<int32_t> tokens =
        generate(trainer.model(), tokenizer->encode(config.sample_prompt), options);
    if (lead) {
      print_summary(trainer, config, first_step, train_seconds, last_val);
      fmt::print("---- sample ({} tokens, temperature {}) ----\n{}\n--------\n",
                 config.sample_tokens, config.sample_temperature, tokenizer->decode(tokens));
    }
  } else if (lead) {
    print_summary(trainer, config, first_step, train_seconds, last_val);
  }
}

void print_summary(Trainer& trainer, const TrainConfig& config, int64_t first_step,
                   double train_seconds, std::optional<double> last_val) {
  fmt::print("trained {} steps in {:.1f} s", config.steps - first_step, train_seconds);
  if (last_val) fmt::print(" | final validation loss {:.4f}", *last_val);
  fmt::print("\n");
  if (const GradReducer* reducer = trainer.grad_reducer()) {
    const double comm_s = reducer->communication_seconds();
    const double exposed_s = reducer->exposed_seconds();
    fmt::print(
        "gradient reduction (rank 0): {} buckets, {:.2f} ms/step on the comm thread, {:.2f} "
        "ms/step exposed after backward ({:.0f}% hidden)\n",
        reducer->buckets().size(), 1e3 * comm_s / double(config.steps),
        1e3 * exposed_s / double(config.steps),
        comm_s > 0 ? 100.0 * std::max(0.0, 1.0 - exposed_s / comm_s) : 0.0);
  }

  if (!config.out_dir.empty()) {
    std::filesystem::path dir = std::filesystem::path(config.out_dir) / "final";
    save_checkpoint(dir, config, trainer.model(), trainer.optimizer(), trainer.step());
    fmt::print("checkpoint written to {}\n", dir.string());
  }
}

void run_train(const TrainArgs& args) {
  TrainConfig config = load_train_config(args.config, args.overrides);
  const TransportKind transport = parse_transport(args.transport);
  const MeshShape shape{.pp = 1, .dp = args.dp, .tp = args.tp};
  // Everything that can be checked before a rank starts is checked here, once.
  validate_tensor_parallel(config.model, {args.tp, 0, args.sp});
  const int cores = available_cores();
  const int world = shape.world_size();
  if (transport == TransportKind::kThreads && world * std::max(1, config.threads) > cores) {
    LATTICE_THROW(ConfigError,
                  "{} in-process ranks (--dp {} x --tp {}) with train.threads = {} need {} cores "
                  "but {} are available ---> HINT: ranks x threads must not exceed the cores; "
                  "lower --dp, --tp or train.threads, or run under mpirun with --transport mpi",
                  world, args.dp, args.tp, config.threads, world * std::max(1, config.threads),
                  cores);
  }
  if (args.zero >= 1 && (!config.out_dir.empty() || !args.resume.empty())) {
    LATTICE_THROW(ConfigError,
                  "--zero {} shards the optimizer state, which checkpoints cannot save yet ---> "
                  "HINT: add --set output.dir= (no checkpoint) or use --zero 0",
                  args.zero);
  }
  if (args.tp > 1 && (!config.out_dir.empty() || !args.resume.empty() || !args.init_from.empty())) {
    LATTICE_THROW(ConfigError,
                  "--tp {} holds parameters as tensor-parallel shards, which checkpoints cannot "
                  "save or load yet ---> HINT: add --set output.dir= (no checkpoint) or use --tp 1",
                  args.tp);
  }
  launch_ranks(transport, world, [&](Communicator& comm) {
    DeviceMesh mesh(comm, shape);
    train_rank(args, config, mesh);
  });
}

}  // namespace

void register_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  cmd->add_option("config", args->config, "The TOML config (see configs/)")->required();
  cmd->add_option("--set", args->overrides, "Override a config key: section.key=value")
      ->allow_extra_args(false);
  cmd->add_option("--metrics", args->metrics, "Write one JSON object per step to this file");
  cmd->add_option("--init-from", args->init_from,
                  "Start from Hugging Face safetensors weights of a matching config");
  cmd->add_option("--dp", args->dp, "Data-parallel ranks")->check(CLI::PositiveNumber);
  cmd->add_option("--tp", args->tp, "Tensor-parallel ranks (heads, d_ff and vocabulary split)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--sp", args->sp,
                "Sequence parallelism: split the residual stream's token rows over the tp group");
  cmd->add_option("--transport", args->transport,
                  "threads (in-process ranks) or mpi (one rank per process, under mpirun)");
  cmd->add_option("--zero", args->zero, "ZeRO stage: 0 replicated, 1 optimizer state sharded")
      ->check(CLI::Range(0, 1));
  cmd->add_option("--bucket-mb", args->bucket_mb, "Gradient bucket size in MB (dp > 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--resume", args->resume,
                  "Continue from a checkpoint directory, or 'auto': the newest valid one under "
                  "output.dir/checkpoints");
  cmd->add_flag("--check-replicas", args->check_replicas,
                "After every step, check that all dp replicas hold identical parameters");
  cmd->callback([args] { run_train(*args); });
}

}  // namespace lattice::cli
