// Registration of the `lattice` subcommands, one function per file.
#pragma once

#include <CLI/CLI.hpp>

namespace lattice::cli {

void register_commands(CLI::App& app);

}  // namespace lattice::cli
