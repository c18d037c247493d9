// `lattice train CONFIG.toml [--set key=value ...] [--metrics FILE]`: trains on one rank with a
// progress line per step, validation every eval.interval steps, a final checkpoint and, if
// sample.tokens > 0, sampled text at the end.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "ckpt/checkpoint.h"
#include "cli/commands.h"
#include "core/cpu_peak.h"
#include "core/thread_budget.h"
#include "core/timer.h"
#include "data/tokenizer.h"
#include "model/generate.h"
#include "train/metrics_log.h"
#include "train/trainer.h"

namespace lattice::cli {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string metrics;
  std::string init_from;
};

void print_sample(Transformer& model, const TrainConfig& config) {
  auto tokenizer = make_tokenizer(config.tokenizer);
  SampleOptions options{config.sample_tokens, config.sample_temperature, config.sample_seed};
  std::vector<int32_t> tokens = generate(model, tokenizer->encode(config.sample_prompt), options);
  fmt::print("---- sample ({} tokens, temperature {}) ----\n{}\n--------\n", config.sample_tokens,
             config.sample_temperature, tokenizer->decode(tokens));
}

void run_train(const TrainArgs& args) {
  Stopwatch wall;
  TrainConfig config = load_train_config(args.config, args.overrides);
  Arena arena("rank0");
  Trainer trainer(config, arena);
  config = trainer.config();  // with the batch resolved
  if (!args.init_from.empty()) {
    load_hf_weights(args.init_from, trainer.model());
    fmt::print("initialised from {}\n", args.init_from);
  }

  const int threads = thread_budget();
  const double peak = measured_fp32_peak_flops_per_thread() * threads;
  fmt::print(
      "lattice train: {} ({} parameters) | {} | global batch {} = {} x {} micro-batches of T={} "
      "({} tokens) | {} steps | {} thread(s), fp32 peak {:.1f} GFLOP/s\n",
      config.model.name, trainer.model().registry().total_elements(),
      config.compute_dtype == DType::kBF16 ? "bf16 compute, fp32 master" : "fp32",
      config.global_batch, config.micro_batch, config.micro_batches, config.seq_len,
      config.tokens_per_step(), config.steps, threads, peak / 1e9);

  std::optional<MetricsLog> metrics;
  if (!args.metrics.empty()) metrics.emplace(args.metrics);
  std::optional<double> last_val;
  for (int64_t s = 0; s < config.steps; ++s) {
    StepMetrics m = trainer.train_step();
    const bool last = m.step == config.steps;
    const bool eval_due =
        trainer.has_validation() &&
        ((config.eval_interval > 0 && m.step % config.eval_interval == 0) || last);
    if (eval_due) last_val = m.val_loss = trainer.evaluate();
    if (m.step % config.log_interval == 0 || eval_due || last || m.step == 1) {
      fmt::print("{}\n", format_progress(m, config.steps, peak));
      std::fflush(stdout);
    }
    if (metrics) metrics->write(m, peak);
  }
  fmt::print("trained {} steps in {:.1f} s", config.steps, wall.seconds());
  if (last_val) fmt::print(" | final validation loss {:.4f}", *last_val);
  fmt::print("\n");

  if (!config.out_dir.empty()) {
    std::filesystem::path dir = std::filesystem::path(config.out_dir) / "final";
    save_checkpoint(dir, config, trainer.model(), trainer.optimizer(), trainer.step());
    fmt::print("checkpoint written to {}\n", dir.string());
  }
  if (config.sample_tokens > 0) print_sample(trainer.model(), config);
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
  cmd->callback([args] { run_train(*args); });
}

}  // namespace lattice::cli
