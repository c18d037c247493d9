// `lattice export --ckpt DIR --out DIR [--max-shard-size 5GB]`: a Hugging Face directory
// (config.json and model.safetensors, or the hub's shards and index) for the model's family.
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <memory>
#include <string_view>

#include "ckpt/checkpoint.h"
#include "ckpt/hf_format.h"
#include "cli/commands.h"

namespace lattice::cli {

namespace {

struct ExportArgs {
  std::string ckpt;
  std::string out;
  std::string max_shard_size = "5GB";
};

// "5GB", "200MB", "1.5GiB", "4096": transformers' units (KB, MB, GB decimal; KiB, MiB, GiB
// binary); ConfigError naming the text and the form.
uint64_t parse_shard_size(std::string_view text) {
  double value = 0;
  const auto [unit_at, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  const std::string_view unit = ec == std::errc{} ? text.substr(size_t(unit_at - text.data())) : "";
  double scale = 0;
  for (auto [name, bytes] : {std::pair<std::string_view, double>{"", 1},
                             {"B", 1},
                             {"KB", 1e3},
                             {"MB", 1e6},
                             {"GB", 1e9},
                             {"KiB", 1024.0},
                             {"MiB", 1048576.0},
                             {"GiB", 1073741824.0}}) {
    if (unit == name) scale = bytes;
  }
  const double bytes = value * scale;
  if (ec != std::errc{} || scale == 0 || !(bytes >= 1 && bytes < 1e18)) {
    LATTICE_THROW(ConfigError,
                  "--max-shard-size '{}' is not a size ---> HINT: use a number of bytes with "
                  "KB, MB, GB (decimal) or KiB, MiB, GiB, e.g. 5GB (the hub's default) or 500MB",
                  text);
  }
  return uint64_t(std::llround(bytes));
}

void run_export(const ExportArgs& args) {
  const HfExportOptions options{.max_shard_bytes = parse_shard_size(args.max_shard_size)};
  Arena arena("rank0");
  CheckpointInfo info;
  std::unique_ptr<Transformer> model = load_checkpoint_model(args.ckpt, arena, &info);
  export_hf(args.out, *model, options);
  const bool sharded =
      std::filesystem::exists(std::filesystem::path(args.out) / "model.safetensors.index.json");
  fmt::print("exported {} ({}) to {}/{} and {}/config.json\n", model->config().name,
             family_name(model->config().family), args.out,
             sharded ? "model.safetensors.index.json and its shards" : "model.safetensors",
             args.out);
}

}  // namespace

void register_export_command(CLI::App& app) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand("export", "Write a checkpoint as a Hugging Face directory");
  cmd->add_option("--ckpt", args->ckpt, "Checkpoint directory (e.g. runs/x/final)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--out", args->out, "Output directory")->required();
  cmd->add_option("--max-shard-size", args->max_shard_size,
                  "Largest weight file, e.g. 5GB (default, as the hub) or 500MB: a larger model "
                  "is split into model-0000k-of-0000n.safetensors with an index");
  cmd->callback([args] { run_export(*args); });
}

}  // namespace lattice::cli
