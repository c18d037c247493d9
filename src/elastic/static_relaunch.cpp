#include "elastic/static_relaunch.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/stop_request.h"
#include "elastic/agent.h"

extern char** environ;

namespace lattice {
namespace {

// One run of the whole job; its exit code (128 + signal when mpirun was killed).
int run_once(const StaticRelaunchOptions& options, const std::vector<std::string>& command) {
  std::vector<std::string> args = {"mpirun", "-np", std::to_string(options.nproc)};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");  // OpenMPI refuses root otherwise
  args.push_back(options.executable.string());
  args.insert(args.end(), command.begin(), command.end());
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!std::string_view(*e).starts_with("LATTICE_FAULT_DIR=")) env.emplace_back(*e);
  }
  if (!options.fault_dir.empty()) env.push_back("LATTICE_FAULT_DIR=" + options.fault_dir.string());
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, "mpirun", nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) {
    LATTICE_THROW(ConfigError,
                  "lattice launch -- train ... --transport mpi runs the job with mpirun, which "
                  "cannot be started: {} ---> HINT: bash scripts/setup.sh installs OpenMPI",
                  std::strerror(rc));
  }
  bool forwarded = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  for (;;) {
    int status = 0;
    const pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return 128 + WTERMSIG(status);
    }
    if (stop_requested() != 0 && !forwarded) {
      forwarded = true;
      ::kill(pid, SIGTERM);  // mpirun forwards it to every rank
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(int64_t(options.grace_s * 1e3));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      spdlog::error(
          "agent: the MPI job outlived the grace period of {} s: killed ---> HINT: "
          "raise --grace-s",
          options.grace_s);
      ::kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

int run_static_relaunch(const StaticRelaunchOptions& options) {
  std::vector<std::string> command = options.command;
  for (int attempt = 0;; ++attempt) {
    const int code = run_once(options, command);
    if (code == 0) return 0;
    if (stop_requested() != 0) return code;
    // 3: a rank refused its input (docs/elastic.md): a relaunch would refuse it again.
    if (code == 3 || attempt >= options.max_restarts) {
      spdlog::error(
          "agent: the MPI job ended with code {}{} ---> HINT: its ranks' errors are above", code,
          code == 3 ? " (a rank refused its input: a relaunch would end the same way)"
                    : fmt::format(" after {} relaunch(es), --max-restarts {}", attempt,
                                  options.max_restarts));
      return code;
    }
    if (!has_flag(command, "--resume")) {
      command.push_back("--resume");
      command.push_back("auto");
    }
    spdlog::warn(
        "agent: the MPI job ended with code {}: relaunching all {} ranks from the newest "
        "checkpoint under output.dir (--resume auto; relaunch {} of at most {})",
        code, options.nproc, attempt + 1, options.max_restarts);
  }
}

}  // namespace lattice
