#include "cli/commands.h"

namespace lattice::cli {

void register_commands(CLI::App& app) {
  (void)app;
}

}  // namespace lattice::cli
