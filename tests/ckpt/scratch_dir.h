// A fresh, empty directory per test under the system temp directory, unique per process (two
// builds' suites may run at once) and removed when the test program exits normally.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace lattice::testing {

inline std::filesystem::path scratch_dir(const std::string& name) {
  struct RemovedAtExit {
    std::vector<std::filesystem::path> dirs;
    ~RemovedAtExit() {
      std::error_code ec;
      for (const auto& dir : dirs) std::filesystem::remove_all(dir, ec);
    }
  };
  static RemovedAtExit created;
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("lattice_ckpt_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  created.dirs.push_back(dir);
  return dir;
}

}  // namespace lattice::testing
