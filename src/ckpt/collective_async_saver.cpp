#include "ckpt/collective_async_saver.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <utility>
#include <vector>

#include "ckpt/collective_save.h"
#include "ckpt/snapshot_slots.h"
#include "core/atomic_file.h"
#include "core/error.h"

namespace lattice {

namespace fs = std::filesystem;

namespace {

void record_write(const fs::path& staging, int rank, const Manifest& header,
                  const std::string& result) {
  const nlohmann::json record = {{"manifest", manifest_to_text(header)}, {"result", result}};
  write_file_atomically(write_record_path(staging, rank), record.dump());
}

// The records are the staging directory's, not the checkpoint's: removed from the committed
// directory once the rename made it one. Not before: a process killed mid-commit (the lead's
// commit runs beside the next step) must leave a staging directory the next generation can
// still commit from its records.
void remove_write_records(const fs::path& dir, int ranks) {
  for (int r = 0; r < ranks; ++r) {
    std::error_code ec;
    fs::remove(write_record_path(dir, r), ec);
  }
}

std::optional<int64_t> staging_step(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (!dir.has_filename() || !name.starts_with("step_") || !name.ends_with(".tmp")) {
    return std::nullopt;
  }
  const std::string digits = name.substr(5, name.size() - 9);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

}  // namespace

// What a rank leaves in the staging directory once its shard file is written
// (CommitOptions::record_writes): the manifest header and its write result.
fs::path write_record_path(const fs::path& staging, int rank) {
  return staging / fmt::format("written_rank_{:05d}.json", rank);
}

bool CollectiveAsyncSaver::leads_its_root() const {
  const int rank = world_.rank();
  const std::vector<int>& nodes = options_.node_of_rank;
  if (nodes.empty()) return rank == 0;
  return std::find(nodes.begin(), nodes.end(), nodes.at(size_t(rank))) - nodes.begin() == rank;
}

namespace {

// Commits staging step `step` from its write records (every rank's, else nullopt), and the
// records are gone from the checkpoint.
std::optional<fs::path> commit_recorded(const CheckpointRoot& checkpoints, int64_t step,
                                        const CommitOptions& options) {
  const fs::path staging = checkpoints.staging_dir(step);
  std::optional<Manifest> header;
  std::vector<RankWriteResult> results;
  int ranks = 1;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(write_record_path(staging, r));
    if (!in) {
      spdlog::warn("snapshot {}: rank {} never finished writing it: not restored", staging.string(),
                   r);
      return std::nullopt;
    }
    const nlohmann::json record = nlohmann::json::parse(in);
    if (!header) {
      header = manifest_from_text(record.at("manifest").get<std::string>(),
                                  write_record_path(staging, r));
      ranks = header->layout.dp * header->layout.tp * header->layout.pp;
    }
    results.push_back(
        rank_write_result_from_json(nlohmann::json::parse(record.at("result").get<std::string>())));
  }
  const fs::path committed = checkpoints.commit(std::move(*header), results, options);
  remove_write_records(committed, ranks);
  return committed;
}

// The newest staging step under `root` newer than its newest committed one.
std::optional<int64_t> newest_uncommitted_staging(const CheckpointRoot& checkpoints) {
  const std::vector<int64_t> committed = checkpoints.committed_steps();
  const int64_t newest = committed.empty() ? -1 : committed.front();
  std::optional<int64_t> step;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoints.path(), ec)) {
    const std::optional<int64_t> s =
        entry.is_directory() ? staging_step(entry.path()) : std::nullopt;
    if (s && *s > newest && (!step || *s > *step)) step = s;
  }
  return step;
}

}  // namespace

std::optional<fs::path> commit_written_staging(const fs::path& root, const CommitOptions& options) {
  const CheckpointRoot checkpoints(root);
  const std::optional<int64_t> step = newest_uncommitted_staging(checkpoints);
  if (!step) return std::nullopt;
  return commit_recorded(checkpoints, *step, options);
}

std::optional<int64_t> newest_restorable_step(const fs::path& root) {
  const CheckpointRoot checkpoints(root);
  const std::vector<int64_t> committed = checkpoints.committed_steps();
  std::optional<int64_t> newest;
  if (!committed.empty()) newest = committed.front();
  if (const std::optional<SlotSnapshot> slots = newest_slot_snapshot(root)) {
    if (!newest || slots->step > *newest) newest = slots->step;
  }
  const std::optional<int64_t> staged = newest_uncommitted_staging(checkpoints);
  if (!staged) return newest;
  const fs::path staging = checkpoints.staging_dir(*staged);
  std::ifstream in(write_record_path(staging, 0));
  if (!in) return newest;
  const nlohmann::json record = nlohmann::json::parse(in, nullptr, false);
  if (record.is_discarded()) return newest;
  const Manifest header =
      manifest_from_text(record.at("manifest").get<std::string>(), write_record_path(staging, 0));
  const int ranks = header.layout.dp * header.layout.tp * header.layout.pp;
  for (int r = 1; r < ranks; ++r) {
    if (!fs::exists(write_record_path(staging, r))) return newest;
  }
  return staged;
}

void remove_staging(const fs::path& root) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (entry.is_directory() && staging_step(entry.path())) stale.push_back(entry.path());
  }
  for (const fs::path& dir : stale) fs::remove_all(dir, ec);
}

CollectiveAsyncSaver::CollectiveAsyncSaver(fs::path root, Communicator& world,
                                           CommitOptions options)
    : root_(std::move(root)), world_(world), options_(std::move(options)) {}

CollectiveAsyncSaver::~CollectiveAsyncSaver() {
  if (!pending_.valid()) return;
  pending_.wait();  // the background thread reads the snapshot, which dies with us
  spdlog::warn(
      "checkpoint step {} was still being saved when its saver closed: not committed{}",
      manifest_ ? manifest_->step : -1,
      options_.record_writes ? " (its written shards are kept for the next generation)" : "");
  // Recorded writes stay for the next generation to commit if every rank finished.
  if (leads_its_root() && manifest_ && !options_.record_writes) {
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
  const fs::path staging = root_.staging_dir(step);
  if (options_.write_at_save) {
    // No collective here: every rank makes the directory, and a stale one of this step (a
    // world that failed while writing it) was removed when its successor restored
    // (remove_staging).
    manifest_ = std::move(manifest);
    WriteOutcome outcome;
    outcome.error = capture_error([&] {
      fs::create_directories(staging);
      if (options_.before_write) options_.before_write(world_.rank());
      report_nested_phase(options_.write_phase);
      const fs::path reuse =
          options_.recycle_pruned ? root_.recycled_file(rank_file_name(world_.rank())) : fs::path();
      outcome.result =
          rank_write_result_to_json(write_rank_shards(staging, world_.rank(), shards, reuse))
              .dump();
      if (options_.record_writes) record_write(staging, world_.rank(), *manifest_, outcome.result);
    });
    pending_ = std::async(std::launch::async, [this, staging, rank = world_.rank(),
                                               outcome = std::move(outcome)]() mutable {
      if (outcome.error.empty() && options_.replicate) {
        outcome.error = capture_error([&] { options_.replicate(staging, rank); });
      }
      return outcome;
    });
    return;
  }
  std::string error;
  if (leads_its_root()) {
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
  pending_ = std::async(std::launch::async, [this, staging, rank = world_.rank(),
                                             header = *manifest_] {
    WriteOutcome outcome;
    outcome.error = capture_error([&] {
      if (options_.before_write) options_.before_write(rank);
      report_nested_phase(options_.write_phase);  // on the writer thread, inside the write
      outcome.result =
          rank_write_result_to_json(write_rank_shards(staging, rank, snapshot_.shards())).dump();
      if (options_.record_writes) record_write(staging, rank, header, outcome.result);
      if (options_.replicate) options_.replicate(staging, rank);
    });
    return outcome;
  });
}

bool CollectiveAsyncSaver::poll() {
  if (!in_flight()) return false;
  if (options_.write_at_save && !options_.replicate) {
    // Every rank's shard was written in save(): no collective to ask.
    finish();
    return true;
  }
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
  if (pending_.valid()) finish();
  rethrow_kept_error();
}

void CollectiveAsyncSaver::finish() {
  const WriteOutcome mine = pending_.get();  // blocks until this rank's write is done
  Manifest manifest = std::move(*manifest_);
  manifest_.reset();
  const int64_t step = manifest.step;
  const fs::path target = root_.step_dir(step);
  const bool lead = leads_its_root();
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
        const fs::path staging = root_.staging_dir(step);
        // A node's copy lacks a shard its replication did not bring (a peer lost while
        // sending): that node keeps the previous step. Its copy holds only the kept ranks'
        // shards: on more than two nodes no copy is whole, the next generation fills them.
        for (int r : options_.kept_ranks) {
          if (!fs::exists(staging / parsed.at(size_t(r)).file.name)) {
            spdlog::warn("snapshot {}: this node's copy lacks {}: not committed here",
                         staging.string(), parsed.at(size_t(r)).file.name);
            abandon();
            return;
          }
        }
        root_.commit(std::move(manifest), parsed, options_);
        if (options_.record_writes) remove_write_records(target, world_.size());
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
