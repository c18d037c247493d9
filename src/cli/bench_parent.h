// The `lattice bench` parent subcommand, shared by every `bench <what>` file: CLI11 throws when
// a subcommand name is added twice, so each registers under the one this returns.
#pragma once

#include <CLI/CLI.hpp>

namespace lattice::cli {

// The existing `bench` subcommand of `app`, or a new one (requiring one sub-subcommand).
CLI::App* bench_parent(CLI::App& app);

}  // namespace lattice::cli
