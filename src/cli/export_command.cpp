// `lattice export --ckpt DIR --out DIR`: a Hugging Face directory (model.safetensors and
// config.json) for the model's family.
#include <fmt/format.h>

#include <memory>

#include "ckpt/checkpoint.h"
#include "cli/commands.h"

namespace lattice::cli {

namespace {

struct ExportArgs {
  std::string ckpt;
  std::string out;
};

void run_export(const ExportArgs& args) {
  Arena arena("rank0");
  CheckpointInfo info;
  std::unique_ptr<Transformer> model = load_checkpoint_model(args.ckpt, arena, &info);
  export_hf(args.out, *model);
  fmt::print("exported {} ({}) to {}/model.safetensors and {}/config.json\n", model->config().name,
             family_name(model->config().family), args.out, args.out);
}

}  // namespace

void register_export_command(CLI::App& app) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand("export", "Write a checkpoint as a Hugging Face directory");
  cmd->add_option("--ckpt", args->ckpt, "Checkpoint directory (e.g. runs/x/final)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--out", args->out, "Output directory")->required();
  cmd->callback([args] { run_export(*args); });
}

}  // namespace lattice::cli
