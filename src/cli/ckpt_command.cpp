// `lattice ckpt inspect DIR [--no-verify]`: what a checkpoint holds (layout, step, tensors with
// shapes, dtypes and shards, files with sizes) and whether it verifies. Exits 1 when it does
// not. DIR may be a checkpoint root; then its newest checkpoint is described.
#include <fmt/format.h>

#include <memory>

#include "ckpt/inspect.h"
#include "cli/commands.h"
#include "core/error.h"

namespace lattice::cli {

namespace {

struct InspectArgs {
  std::string dir;
  bool no_verify = false;
};

}  // namespace

void register_ckpt_command(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Look into checkpoints");
  ckpt->require_subcommand(1);
  auto args = std::make_shared<InspectArgs>();
  CLI::App* inspect = ckpt->add_subcommand("inspect", "List what a checkpoint holds and verify it");
  inspect->add_option("dir", args->dir, "Checkpoint directory (step_N) or checkpoint root")
      ->required()
      ->check(CLI::ExistingDirectory);
  inspect->add_flag("--no-verify", args->no_verify, "Skip the checksums (sizes still checked)");
  inspect->callback([args] {
    CheckpointReport report = inspect_checkpoint(args->dir, !args->no_verify);
    fmt::print("{}", report.text);
    if (!report.valid) {
      LATTICE_THROW(IoError, "checkpoint '{}' does not verify (see status above)", args->dir);
    }
  });
}

}  // namespace lattice::cli
