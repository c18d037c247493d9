// Runs the built `lattice` executable (or mpirun) as a user would, with a wall-clock limit,
// and captures its exit, stdout and stderr.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace lattice::testing {

struct CliResult {
  int exit_code = -1;  // -1: killed at the limit or by a signal
  int signal = 0;
  bool timed_out = false;
  double seconds = 0;
  std::string out;
  std::string err;
  std::string all() const { return out + "\n" + err; }
};

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A started command; wait() ends it (SIGKILL to its process group at the limit).
class CliProcess {
 public:
  CliProcess(std::vector<std::string> args, std::vector<std::string> extra_env = {}) {
    static std::atomic<int> counter = 0;  // processes may be started from several threads
    const auto base =
        std::filesystem::temp_directory_path() /
        ("lattice_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    out_path_ = base.string() + ".out";
    err_path_ = base.string() + ".err";
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    for (std::string& e : extra_env) env.push_back(std::move(e));
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&files, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    posix_spawn_file_actions_addopen(&files, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // its own group: killed whole
    posix_spawnattr_setpgroup(&attr, 0);
    start_ = std::chrono::steady_clock::now();
    if (posix_spawn(&pid_, argv[0], &files, &attr, argv.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attr);
  }
  ~CliProcess() {
    if (pid_ > 0 && !done_) wait(0.0);
  }

  pid_t pid() const { return pid_; }
  std::string out_so_far() const { return read_text(out_path_); }
  void signal(int sig) const { ::kill(pid_, sig); }

  CliResult wait(double limit_s) {
    CliResult result;
    const auto deadline = start_ + std::chrono::milliseconds(int64_t(limit_s * 1e3));
    int status = 0;
    for (;;) {
      const pid_t got = ::waitpid(pid_, &status, WNOHANG);
      if (got == pid_) break;
      if (std::chrono::steady_clock::now() > deadline) {
        result.timed_out = true;
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(-pid_, SIGKILL);  // nothing of the group is left behind
    done_ = true;
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
    result.out = read_text(out_path_);
    result.err = read_text(err_path_);
    std::filesystem::remove(out_path_);
    std::filesystem::remove(err_path_);
    return result;
  }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  std::string out_path_, err_path_;
  std::chrono::steady_clock::time_point start_;
};

inline CliResult run_cli(std::vector<std::string> args, double limit_s,
                         std::vector<std::string> extra_env = {}) {
  return CliProcess(std::move(args), std::move(extra_env)).wait(limit_s);
}

// A tiny GPT-2 config (micro-batch 2, T 32, one thread per rank) on a small corpus written
// into `data_dir`; `extra` is more TOML (sections after [train]'s keys). Returns its path.
inline std::filesystem::path write_tiny_config(const std::filesystem::path& data_dir, int steps,
                                               const std::string& extra) {
  const std::filesystem::path config = data_dir / "tiny.toml";
  std::ofstream(config) << "[model]\npreset = \"gpt2-tiny\"\n"
                        << "[data]\ndir = \"" << data_dir.string() << "\"\n"
                        << "[batch]\nmicro_batch = 2\nseq_len = 32\n"
                        << "[train]\nsteps = " << steps << "\nthreads = 1\n"
                        << extra;
  return config;
}

// `lattice train CONFIG` with output.dir=OUT and no sampling, plus `extra` arguments.
inline std::vector<std::string> train_args(const std::filesystem::path& config,
                                           const std::filesystem::path& out,
                                           std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {LATTICE_EXECUTABLE,           "train", config.string(),  "--set",
                                   "output.dir=" + out.string(), "--set", "sample.tokens=0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The value of `"key":NUMBER` in each JSON line of a metrics file that has it.
inline std::vector<double> metric_values(const std::filesystem::path& metrics,
                                         const std::string& key) {
  std::vector<double> out;
  const std::string text = read_text(metrics);
  const std::string needle = "\"" + key + "\":";
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    out.push_back(std::stod(text.substr(at + needle.size())));
  }
  return out;
}

// The last value of `"key":NUMBER` in a metrics file (-1 when no line has it).
inline double last_metric(const std::filesystem::path& metrics, const std::string& key) {
  const std::vector<double> values = metric_values(metrics, key);
  return values.empty() ? -1.0 : values.back();
}

// Waits, up to `limit_s`, until the metrics file of a running job has logged step `step`.
inline void wait_for_step(const std::filesystem::path& metrics, int step, double limit_s = 60) {
  const std::string needle = "\"step\":" + std::to_string(step) + ",";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (read_text(metrics).find(needle) == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Whether two files hold the same bytes.
inline bool same_bytes(const std::filesystem::path& a, const std::filesystem::path& b) {
  return std::filesystem::exists(a) && std::filesystem::exists(b) && read_text(a) == read_text(b);
}

}  // namespace lattice::testing
