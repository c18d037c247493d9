#include "cli/bench_parent.h"

namespace lattice::cli {

CLI::App* bench_parent(CLI::App& app) {
  auto existing =
      app.get_subcommands([](const CLI::App* sub) { return sub->get_name() == "bench"; });
  if (!existing.empty()) return existing.front();
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks of Lattice's layers");
  bench->require_subcommand(1);
  return bench;
}

}  // namespace lattice::cli
