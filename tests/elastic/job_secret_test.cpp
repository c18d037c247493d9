// The job's secret file (elastic/job_secret.h): agent 0 writes it while the other agents poll for
// it, so it must never be seen empty or half written, never replace one that exists, and be the
// user's alone.
#include "elastic/job_secret.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>

#include "core/error.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

TEST(JobSecret, AnAgentPollingForTheFileNeverReadsItHalfWritten) {
  const std::filesystem::path dir = testing::scratch_dir("job_secret_poll");
  const std::string secret = make_job_secret();
  for (int round = 0; round < 50; ++round) {
    const std::filesystem::path path = dir / fmt::format("secret_{}", round);
    std::atomic<bool> done = false;
    std::string seen;
    std::thread reader([&] {
      // An agent of another node: whatever it finds must be the whole secret (a ConfigError
      // "holds no secret" here is the race this guards against).
      while (!done) {
        if (std::optional<std::string> s = read_job_secret(path)) {
          seen = *s;
          return;
        }
      }
    });
    write_job_secret(path, secret);
    reader.join();
    done = true;
    EXPECT_TRUE(seen.empty() || seen == secret) << seen;
    EXPECT_EQ(read_job_secret(path), secret);
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  // Nothing else is left beside the secrets.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

TEST(JobSecret, AnExistingSecretIsNeverReplaced) {
  const std::filesystem::path path = testing::scratch_dir("job_secret_exists") / "secret";
  const std::string first = make_job_secret();
  write_job_secret(path, first);
  EXPECT_THROW(write_job_secret(path, make_job_secret()), IoError);
  EXPECT_EQ(read_job_secret(path), first);
}

}  // namespace
}  // namespace lattice
