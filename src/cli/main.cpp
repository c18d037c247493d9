// The `lattice` command. Each subcommand lives in its own file and registers itself here.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <exception>

#include "cli/commands.h"
#include "core/error.h"

// Exit codes: 0 done, 1 an error, 2 an unexpected one, 3 the input was refused (ConfigError or
// a command-line parse error: retrying cannot help; `lattice launch` ends the job on it,
// elastic/agent.h).
int main(int argc, char** argv) {
  // Logs and errors on stderr: stdout carries what a command produces (tables, --json).
  spdlog::set_default_logger(spdlog::stderr_color_mt("lattice"));
  CLI::App app{"Lattice: train transformer language models across many ranks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lattice 0.1.0");
  lattice::cli::register_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end here too (0). Any other parse error (a missing, unknown or
    // out-of-range flag, a path that does not exist) is input refused like a ConfigError: exit
    // 3, not CLI11's own codes (105, 106, ...), so that `lattice launch` does not restart ranks
    // into the same refusal. CLI11 prints the message and "Run with --help".
    return app.exit(e) == 0 ? 0 : 3;
  } catch (const lattice::ConfigError& e) {
    // The input cannot work as given: a launcher must not retry it.
    spdlog::error("{}", e.what());
    return 3;
  } catch (const lattice::Error& e) {
    spdlog::error("{}", e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("unexpected error: {}", e.what());
    return 2;
  }
  return 0;
}
