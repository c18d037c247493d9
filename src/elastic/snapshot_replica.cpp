#include "elastic/snapshot_replica.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include <fmt/format.h>

#include "ckpt/collective_async_saver.h"
#include "ckpt/manifest.h"
#include "core/atomic_file.h"
#include "core/error.h"

namespace lattice {
namespace {

// Apart from every Communicator's contexts (hashes) and the handshake's.
constexpr uint64_t kReplicaContext = 0x4c41545245504c43ull;  // "LATREPLC"

std::string read_whole(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  std::string bytes(ec ? 0 : size_t(size), '\0');
  if (!in || ec || !in.read(bytes.data(), std::streamsize(bytes.size()))) {
    LATTICE_THROW(IoError, "cannot read {} to replicate it", path.string());
  }
  return bytes;
}

// The shard file a rank's record names.
std::string shard_file_of(const std::filesystem::path& record) {
  const nlohmann::json j = nlohmann::json::parse(read_whole(record));
  return rank_write_result_from_json(nlohmann::json::parse(j.at("result").get<std::string>()))
      .file.name;
}

}  // namespace

SnapshotReplicator::SnapshotReplicator(std::shared_ptr<Transport> transport,
                                       std::vector<int> node_of_rank,
                                       std::chrono::milliseconds timeout)
    : transport_(std::move(transport)), node_of_rank_(std::move(node_of_rank)), timeout_(timeout) {}

int SnapshotReplicator::target(int rank) const {
  const std::set<int> nodes(node_of_rank_.begin(), node_of_rank_.end());
  const int mine = node_of_rank_.at(size_t(rank));
  auto next = nodes.upper_bound(mine);
  if (next == nodes.end()) next = nodes.begin();
  std::vector<int> mates, theirs;
  for (int r = 0; r < int(node_of_rank_.size()); ++r) {
    if (node_of_rank_[size_t(r)] == mine) mates.push_back(r);
    if (node_of_rank_[size_t(r)] == *next) theirs.push_back(r);
  }
  const size_t local = size_t(std::find(mates.begin(), mates.end(), rank) - mates.begin());
  return theirs[local % theirs.size()];
}

std::vector<int> SnapshotReplicator::sources(int rank) const {
  std::vector<int> from;
  for (int r = 0; r < int(node_of_rank_.size()); ++r) {
    if (r != rank && node_of_rank_[size_t(r)] != node_of_rank_[size_t(rank)] && target(r) == rank) {
      from.push_back(r);
    }
  }
  return from;
}

void SnapshotReplicator::replicate(const std::filesystem::path& staging, int rank) const {
  const int to = target(rank);
  if (node_of_rank_.at(size_t(to)) == node_of_rank_.at(size_t(rank))) return;  // one node
  const Deadline deadline = CommClock::now() + timeout_;
  // One step's messages apart from another's: the staging directory names the step.
  const uint64_t tag = std::hash<std::string>{}(staging.filename().string()) << 1;
  const std::filesystem::path record_path = write_record_path(staging, rank);
  const std::string record = read_whole(record_path);
  const std::string name = shard_file_of(record_path);
  const std::string shard = read_whole(staging / name);
  const std::array<uint64_t, 4> header = {uint64_t(rank), name.size(), shard.size(), record.size()};
  const std::string payload = name + shard + record;
  PendingSendPtr head =
      transport_->post_send(to, {kReplicaContext, tag}, header.data(), sizeof(header));
  PendingSendPtr body =
      transport_->post_send(to, {kReplicaContext, tag | 1}, payload.data(), payload.size());
  for (int from : sources(rank)) {
    std::array<uint64_t, 4> theirs{};
    transport_->recv(from, {kReplicaContext, tag}, theirs.data(), sizeof(theirs), deadline);
    std::string bytes(theirs[1] + theirs[2] + theirs[3], '\0');
    transport_->recv(from, {kReplicaContext, tag | 1}, bytes.data(), bytes.size(), deadline);
    const std::string their_name = bytes.substr(0, theirs[1]);
    if (their_name.find('/') != std::string::npos || their_name.empty()) {
      LATTICE_THROW(IoError, "rank {} sent a snapshot shard named '{}': refused", from, their_name);
    }
    // The shard first, its record last: a copy torn here is never committed.
    write_file_atomically(staging / their_name,
                          std::string_view(bytes).substr(theirs[1], theirs[2]));
    write_file_atomically(write_record_path(staging, int(theirs[0])),
                          std::string_view(bytes).substr(theirs[1] + theirs[2]));
  }
  head->wait(deadline);
  body->wait(deadline);
}

}  // namespace lattice
