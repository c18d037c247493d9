// The `lattice` command. Each subcommand lives in its own file and registers itself here.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <exception>

#include "cli/commands.h"
#include "core/error.h"

// Exit codes: 0 done, 1 an error, 2 an unexpected one, 3 the input was refused (ConfigError:
// retrying cannot help; `lattice launch` ends the job on it, elastic/agent.h).
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
    return app.exit(e);
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
