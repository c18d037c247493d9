// Scratch directories for tests: one helper for every suite.
//
// Every directory lives under one root per test process, <tmp>/lattice_test_<pid>, so two
// builds' suites (build/ and build-tsan/, say) running at once never share a path; the root is
// removed when the process exits normally. Rank threads create their own directories at once
// (TensorParallelCheckpoint exports one per rank), so creation is serialised by a mutex.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>

namespace lattice::testing {

namespace scratch_detail {

// The process's root, created on first use and removed at exit by the process that made it
// (a forked child that exits normally must not delete its parent's files).
class ScratchRoot {
 public:
  static ScratchRoot& get() {
    static ScratchRoot root;  // initialisation is thread-safe (C++11 magic statics)
    return root;
  }
  // A fresh, empty directory `name` (may contain '/') under the root.
  std::filesystem::path fresh(const std::string& name) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const std::filesystem::path dir = root_ / name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
  }
  ~ScratchRoot() {
    if (::getpid() != owner_) return;
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  ScratchRoot(const ScratchRoot&) = delete;
  ScratchRoot& operator=(const ScratchRoot&) = delete;

 private:
  ScratchRoot()
      : owner_(::getpid()),
        root_(std::filesystem::temp_directory_path() / ("lattice_test_" + std::to_string(owner_))) {
    std::filesystem::remove_all(root_);  // a dead process's leftovers under a reused pid
    std::filesystem::create_directories(root_);
  }

  const pid_t owner_;
  const std::filesystem::path root_;
  std::mutex mutex_;
};

}  // namespace scratch_detail

// A fresh, empty directory for `name`, unique to this process, removed at exit. Safe to call
// from several threads at once (with different names).
inline std::filesystem::path scratch_dir(const std::string& name) {
  return scratch_detail::ScratchRoot::get().fresh(name);
}

// A fixture whose dir_ is a fresh directory named after the running test, removed after it.
class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = scratch_dir(std::string(info->test_suite_name()) + "/" + info->name());
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::filesystem::path dir_;
};

}  // namespace lattice::testing
