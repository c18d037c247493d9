// `lattice sample --ckpt DIR --prompt TEXT [--tokens N] [--temperature T] [--seed S]`.
#include <fmt/format.h>

#include <memory>

#include "ckpt/checkpoint.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "core/thread_budget.h"
#include "data/tokenizer.h"
#include "model/generate.h"

namespace lattice::cli {

namespace {

struct SampleArgs {
  std::string ckpt;
  std::string prompt = "\n";
  int64_t tokens = 200;
  float temperature = 1.0f;
  uint64_t seed = 42;
};

void run_sample(const SampleArgs& args) {
  set_thread_budget(available_cores());
  Arena arena("rank0");
  CheckpointInfo info;
  std::unique_ptr<Transformer> model = load_checkpoint_model(args.ckpt, arena, &info);
  auto tokenizer = make_tokenizer(info.tokenizer);
  std::vector<int32_t> tokens =
      generate(*model, tokenizer->encode(args.prompt), {args.tokens, args.temperature, args.seed});
  fmt::print("{}\n", tokenizer->decode(tokens));
}

}  // namespace

void register_sample_command(CLI::App& app) {
  auto args = std::make_shared<SampleArgs>();
  CLI::App* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  cmd->add_option("--ckpt", args->ckpt, "Checkpoint directory (e.g. runs/x/final)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--prompt", args->prompt, "Text to continue");
  cmd->add_option("--tokens", args->tokens, "Tokens to generate")->check(non_negative_number());
  cmd->add_option("--temperature", args->temperature, "Softmax temperature (0: greedy)")
      ->check(non_negative_number());
  cmd->add_option("--seed", args->seed, "Sampling seed");
  cmd->callback([args] { run_sample(*args); });
}

}  // namespace lattice::cli
