#include "ckpt/collective_save.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace lattice {

namespace fs = std::filesystem;

void expect_all_succeeded(Communicator& world, const std::string& error, std::string_view phase,
                          const fs::path& target, std::chrono::milliseconds timeout) {
  expect_none_failed(all_gather_strings(world, error, timeout), phase, target);
}

void expect_none_failed(const std::vector<std::string>& errors, std::string_view phase,
                        const fs::path& target) {
  std::string failed;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) failed += fmt::format("\n  rank {}: {}", r, errors[r]);
  }
  if (!failed.empty()) {
    LATTICE_THROW(IoError,
                  "checkpoint '{}' was not committed: {} failed on{} ---> HINT: fix the cause "
                  "(disk space, permissions) and save again; the previous checkpoint is intact",
                  target.string(), phase, failed);
  }
}

std::string capture_error(const std::function<void()>& body) {
  try {
    body();
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::vector<std::string> all_gather_strings(Communicator& world, const std::string& text,
                                            std::chrono::milliseconds timeout) {
  // A fixed algorithm: the tuner would time these tiny calls against ranks still writing (or,
  // for an asynchronous save, still training) and log them as slow.
  const CollectiveOptions options{.timeout = timeout, .algorithm = Algorithm::kRing};
  const int n = world.size();
  std::vector<int32_t> lengths(size_t(n), 0);
  const auto length = int32_t(text.size());
  world.all_gather(&length, lengths.data(), 1, DType::kI32, options);
  const int32_t longest = *std::max_element(lengths.begin(), lengths.end());
  // Every string empty (the usual outcome: no rank failed): the lengths said it all, and every
  // rank saw the same lengths, so every rank skips the second call.
  if (longest == 0) return std::vector<std::string>(size_t(n));
  const int64_t words = (int64_t(longest) + 3) / 4;  // bytes travel as int32 words
  std::vector<int32_t> mine(size_t(std::max<int64_t>(words, 1)), 0);
  std::memcpy(mine.data(), text.data(), text.size());
  std::vector<int32_t> all(mine.size() * size_t(n), 0);
  world.all_gather(mine.data(), all.data(), int64_t(mine.size()), DType::kI32, options);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    const auto* bytes = reinterpret_cast<const char*>(all.data() + size_t(r) * mine.size());
    out.emplace_back(bytes, size_t(lengths[size_t(r)]));
  }
  return out;
}

fs::path save_sharded_checkpoint(const CheckpointTarget& target, Manifest manifest,
                                 const std::vector<OwnedShard>& shards, Communicator& world,
                                 const CommitOptions& options) {
  const int64_t step = manifest.step;
  const fs::path staging = target.staging_dir(step);
  const fs::path committed = target.committed_dir(step);
  const bool lead = world.rank() == 0;
  const std::chrono::milliseconds timeout = options.peer_timeout;
  auto abandon = [&] {  // only the staging directory, never a committed checkpoint
    if (!lead) return;
    std::error_code ec;
    fs::remove_all(staging, ec);
  };

  std::string error;
  if (lead) {
    error = capture_error([&] {
      target.prepare_staging(step);
      if (options.hook) options.hook(CommitStage::kStagingCreated);
    });
  }
  expect_all_succeeded(world, error, "preparing the staging directory", committed, timeout);

  std::string result;
  error = capture_error([&] {
    if (options.before_write) options.before_write(world.rank());
    report_nested_phase(options.write_phase);
    result = rank_write_result_to_json(write_rank_shards(staging, world.rank(), shards)).dump();
  });
  try {
    expect_all_succeeded(world, error, "writing shards", committed, timeout);
  } catch (const IoError&) {
    abandon();
    throw;
  }
  std::vector<std::string> results = all_gather_strings(world, result, timeout);

  if (lead) {
    error = capture_error([&] {
      if (options.hook) options.hook(CommitStage::kShardsWritten);
      std::vector<RankWriteResult> parsed;
      for (const std::string& text : results) {
        parsed.push_back(rank_write_result_from_json(nlohmann::json::parse(text)));
      }
      target.commit(std::move(manifest), parsed, options);
    });
    if (!error.empty()) abandon();
  }
  expect_all_succeeded(world, error, "the commit", committed, timeout);
  return committed;
}

}  // namespace lattice
