// The layout flags of `lattice train`, `lattice explain` and `lattice doctor` (--dp, --tp, --sp,
// --zero, --pp, ...): declared once, applied over the config's [parallel] keys only when given on
// the command line.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "train/train_config.h"

namespace lattice::cli {

struct LayoutFlags {
  // The values given; their defaults are never used (apply_layout_flags reads only those given).
  ParallelConfig layout;
  // The flags that name a choice, parsed by apply_layout_flags.
  std::string transport, schedule, recompute;
};

void add_layout_flags(CLI::App& cmd, LayoutFlags& flags);

// The config's [parallel] section with every layout flag given on the command line applied
// over it (CLI11's count() is 0 for a flag left out, whatever its default). ConfigError for a
// misspelt choice.
void apply_layout_flags(const CLI::App& cmd, const LayoutFlags& flags, ParallelConfig& layout);

// The config a command line gives (`train`, `explain`, `doctor`): the file with its --set
// overrides, then the layout flags given. One function, so that explain shows what train runs.
TrainConfig resolve_layout_config(const std::string& path,
                                  const std::vector<std::string>& overrides, const CLI::App& cmd,
                                  const LayoutFlags& flags);

}  // namespace lattice::cli
