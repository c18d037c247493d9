// A sharded checkpoint saved by every rank of a run at once (tp × dp, ZeRO): the two phases of
// shard_writer.h with the coordination they leave to the caller.
//
//   world rank 0:  prepare_staging(step)                 -> outcome to every rank
//   every rank:    write_rank_shards(staging, world rank) -> results (or errors) to every rank
//   world rank 0:  commit(manifest, results)             -> outcome to every rank
//
// The atomic commit is unchanged: only rank 0 renames and updates `latest`, after every rank's
// file is written and fsynced. A failure on any rank (a full disk, a bad shard) reaches every
// rank as the same IoError naming the rank and why, and nothing is committed (the staging
// directory is removed). Every rank must call it with the same manifest header.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/shard_writer.h"
#include "comm/communicator.h"

namespace lattice {

// `shards`: what this rank owns (a replicated tensor from its owner only). Returns the committed
// directory (target.committed_dir) on every rank. CommitOptions::hook is called on world rank 0.
std::filesystem::path save_sharded_checkpoint(const CheckpointTarget& target, Manifest manifest,
                                              const std::vector<OwnedShard>& shards,
                                              Communicator& world,
                                              const CommitOptions& options = {});

// The phases' shared step, for savers that spread the phases over time (async_saver.h): every
// rank passes its outcome of `phase` ("" on success, else why it failed); when any failed, every
// rank throws the same IoError naming each failed rank and why ("checkpoint '<target>' was not
// committed: <phase> failed on rank 1: ..."). Collective over `world`.
void expect_all_succeeded(Communicator& world, const std::string& error, std::string_view phase,
                          const std::filesystem::path& target, std::chrono::milliseconds timeout);
// The same on outcomes already gathered (every rank's error, "" for success), without a call.
void expect_none_failed(const std::vector<std::string>& errors, std::string_view phase,
                        const std::filesystem::path& target);
// Runs `body` and returns "" or the message of the exception it threw.
std::string capture_error(const std::function<void()>& body);

// Every rank's `text`, in rank order, on every rank (lengths then padded bytes, as all-gathers).
std::vector<std::string> all_gather_strings(Communicator& world, const std::string& text,
                                            std::chrono::milliseconds timeout);

}  // namespace lattice
