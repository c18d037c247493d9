#include "ckpt/collective_async_saver.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "ckpt/collective_save.h"
#include "core/error.h"

namespace lattice {

namespace fs = std::filesystem;

CollectiveAsyncSaver::CollectiveAsyncSaver(fs::path root, Communicator& world,
                                           CommitOptions options)
    : root_(std::move(root)), world_(world), options_(std::move(options)) {}

CollectiveAsyncSaver::~CollectiveAsyncSaver() {
  if (!pending_.valid()) return;
  pending_.wait();  // the background thread reads the snapshot, which dies with us
  spdlog::warn("checkpoint step {} was still being saved when its saver closed: not committed",
               manifest_ ? manifest_->step : -1);
  if (world_.rank() == 0 && manifest_) {
    std::error_code ec;
    fs::remove_all(root_.staging_dir(manifest_->step), ec);
  }
}

void CollectiveAsyncSaver::rethrow_kept_error() {
  if (!error_) return;
  std::exception_ptr error = std::exchange(error_, nullptr);
  std::rethrow_exception(error);
}

void CollectiveAsyncSaver::save(Manifest manifest, const std::vector<OwnedShard>& shards) {
  wait();
  const int64_t step = manifest.step;
  const fs::path target = root_.step_dir(step);
  std::string error;
  if (world_.rank() == 0) {
    error = capture_error([&] {
      fs::create_directories(root_.path());
      root_.prepare_staging(step);
      if (options_.hook) options_.hook(CommitStage::kStagingCreated);
    });
  }
  expect_all_succeeded(world_, error, "preparing the staging directory", target,
                       options_.peer_timeout);

  snapshot_.take(shards);  // the stall: from here on training may change the shards' tensors
  manifest_ = std::move(manifest);
  const fs::path staging = root_.staging_dir(step);
  pending_ = std::async(std::launch::async, [this, staging, rank = world_.rank()] {
    WriteOutcome outcome;
    outcome.error = capture_error([&] {
      if (options_.before_write) options_.before_write(rank);
      outcome.result =
          rank_write_result_to_json(write_rank_shards(staging, rank, snapshot_.shards())).dump();
    });
    return outcome;
  });
}

bool CollectiveAsyncSaver::poll() {
  if (!in_flight()) return false;
  const int32_t written =
      pending_.wait_for(std::chrono::seconds(0)) == std::future_status::ready ? 1 : 0;
  // A fixed algorithm: the tuner would time this tiny call against ranks still computing.
  std::vector<int32_t> all(size_t(world_.size()), 0);
  world_.all_gather(&written, all.data(), 1, DType::kI32, {.algorithm = Algorithm::kRing});
  if (std::find(all.begin(), all.end(), 0) != all.end()) return false;
  finish();
  return true;
}

void CollectiveAsyncSaver::wait() {
  if (in_flight()) finish();
  rethrow_kept_error();
}

void CollectiveAsyncSaver::finish() {
  const WriteOutcome mine = pending_.get();  // blocks until this rank's write is done
  Manifest manifest = std::move(*manifest_);
  manifest_.reset();
  const int64_t step = manifest.step;
  const fs::path target = root_.step_dir(step);
  const bool lead = world_.rank() == 0;
  auto abandon = [&] {  // only the staging directory, never a committed checkpoint
    if (!lead) return;
    std::error_code ec;
    fs::remove_all(root_.staging_dir(step), ec);
  };
  try {
    // One gather carries each rank's outcome and, on success, its file list: 'E' + why it
    // failed, or 'R' + the result (a call fewer per save than gathering them apart).
    std::vector<std::string> results = all_gather_strings(
        world_, mine.error.empty() ? "R" + mine.result : "E" + mine.error, options_.peer_timeout);
    std::vector<std::string> errors;
    for (std::string& r : results) {
      errors.push_back(r.starts_with('E') ? r.substr(1) : std::string());
      r.erase(0, 1);
    }
    try {
      expect_none_failed(errors, "writing shards", target);
    } catch (const IoError&) {
      // No rank reports the failure before the staging directory is gone: a rank that looks
      // (or a process that restarts) sees the previous checkpoint and nothing else.
      abandon();
      world_.barrier({.timeout = options_.peer_timeout});
      throw;
    }
    std::string error;
    if (lead) {
      error = capture_error([&] {
        if (options_.hook) options_.hook(CommitStage::kShardsWritten);
        std::vector<RankWriteResult> parsed;
        for (const std::string& text : results) {
          parsed.push_back(rank_write_result_from_json(nlohmann::json::parse(text)));
        }
        root_.commit(std::move(manifest), parsed, options_);
      });
      if (!error.empty()) abandon();  // before the outcome reaches anyone
    }
    expect_all_succeeded(world_, error, "the commit", target, options_.peer_timeout);
    last_committed_ = target;
  } catch (const IoError&) {
    error_ = std::current_exception();  // the same message on every rank
  }
}

}  // namespace lattice
