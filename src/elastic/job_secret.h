// The job's secret (docs/elastic.md, "Nobody else gets in"): 32 random bytes, hex, that the
// rendezvous store and every gloo connection of a `lattice launch` job ask for. Agent 0 makes it;
// its ranks get it through their environment (LATTICE_JOB_SECRET, readable only by the user), the
// other agents through a file only the user can read (--secret-file) or the same variable.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace lattice {

// A fresh secret from the kernel's random source.
std::string make_job_secret();

// The secret in `path`. ConfigError when the file is readable by anyone but its owner, or does
// not hold a secret; nullopt when it does not exist.
std::optional<std::string> read_job_secret(const std::filesystem::path& path);

// Writes `secret` to `path` (created with mode 0600, never overwriting): agent 0 of a job.
void write_job_secret(const std::filesystem::path& path, const std::string& secret);

}  // namespace lattice
