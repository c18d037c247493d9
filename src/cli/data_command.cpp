// `lattice data prepare --input FILE --out DIR [--tokenizer byte] [--val-fraction F]`: a text
// corpus -> DIR/train.bin and DIR/val.bin in llm.c's token file layout (data/token_file.h).
// Example (the default corpus, from the repository root):
//   lattice data prepare --input ../shared/data/tinyshakespeare.txt --out
//   runs/data/shakespeare-char
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "data/prepare.h"

namespace lattice::cli {

void register_data_command(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Prepare training data (token files)");
  data->require_subcommand(1);

  auto options = std::make_shared<PrepareOptions>();
  CLI::App* prepare = data->add_subcommand(
      "prepare", "Tokenize a text corpus into train.bin and val.bin (llm.c/nanoGPT layout)");
  prepare->add_option("--input", options->input, "Corpus to tokenize, read as bytes")
      ->required()
      ->check(CLI::ExistingFile);
  prepare->add_option("--out", options->out_dir, "Directory for train.bin and val.bin")->required();
  prepare->add_option("--tokenizer", options->tokenizer, "Tokenizer")
      ->capture_default_str()
      ->check(CLI::IsMember({"byte"}));
  prepare
      ->add_option("--val-fraction", options->val_fraction,
                   "Fraction of the corpus, taken from its end, that becomes val.bin")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  prepare->callback([options] {
    PrepareResult result = prepare_token_files(*options);
    fmt::print("{}: {} tokens\n{}: {} tokens\n", result.train_path.string(), result.train_tokens,
               result.val_path.string(), result.val_tokens);
  });
}

}  // namespace lattice::cli
