#include "elastic/snapshot_replica.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ckpt/collective_async_saver.h"
#include "ckpt/collective_save.h"
#include "ckpt/manifest.h"
#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "core/error.h"

namespace lattice {
namespace {

// Apart from every Communicator's contexts (hashes) and the handshake's.
constexpr uint64_t kReplicaContext = 0x4c41545245504c43ull;  // "LATREPLC"
// The top bit of a tag: fill()'s messages, never a save's; the low bit: a header or its body.
constexpr uint64_t kFillTag = uint64_t(1) << 63;

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

// A rank's shard and its record in a staging directory, as one node sends them to another.
struct ShardCopy {
  std::array<uint64_t, 4> header;  // the rank, the sizes of the shard's name, shard and record
  std::string payload;             // name + shard + record
};

ShardCopy read_shard_copy(const std::filesystem::path& staging, int rank) {
  const std::filesystem::path record_path = write_record_path(staging, rank);
  const std::string record = read_whole(record_path);
  const std::string name = shard_file_of(record_path);
  const std::string shard = read_whole(staging / name);
  return {.header = {uint64_t(rank), name.size(), shard.size(), record.size()},
          .payload = name + shard + record};
}

// The two sends of a ShardCopy, posted; `copy` must outlive them.
struct PostedCopy {
  PendingSendPtr head, body;
  void wait(Deadline deadline) const {
    head->wait(deadline);
    body->wait(deadline);
  }
};

PostedCopy post_shard_copy(Transport& transport, int to, uint64_t tag, const ShardCopy& copy) {
  return {.head = transport.post_send(to, {kReplicaContext, tag}, copy.header.data(),
                                      sizeof(copy.header)),
          .body = transport.post_send(to, {kReplicaContext, tag | 1}, copy.payload.data(),
                                      copy.payload.size())};
}

// Receives a ShardCopy sent with `tag` and writes it into `staging`.
void receive_shard_copy(Transport& transport, int from, uint64_t tag,
                        const std::filesystem::path& staging, Deadline deadline) {
  std::array<uint64_t, 4> header{};
  transport.recv(from, {kReplicaContext, tag}, header.data(), sizeof(header), deadline);
  std::string bytes(header[1] + header[2] + header[3], '\0');
  transport.recv(from, {kReplicaContext, tag | 1}, bytes.data(), bytes.size(), deadline);
  const std::string name = bytes.substr(0, header[1]);
  if (name.find('/') != std::string::npos || name.empty()) {
    LATTICE_THROW(IoError, "rank {} sent a snapshot shard named '{}': refused", from, name);
  }
  // The shard first, its record last: a copy torn here is never committed.
  write_file_atomically(staging / name, std::string_view(bytes).substr(header[1], header[2]));
  write_file_atomically(write_record_path(staging, int(header[0])),
                        std::string_view(bytes).substr(header[1] + header[2]));
}

std::optional<int> record_rank(const std::string& name) {
  constexpr std::string_view kPrefix = "written_rank_", kSuffix = ".json";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return std::nullopt;
  const std::string digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoi(digits);
}

// What a node's copy holds: {"committed": {"step_N@<manifest crc>": [files]}, "staging":
// {"step_N.tmp": [ranks with a record]}}. The manifest's checksum keys a committed snapshot, so
// that files move only between copies of the same save (a step saved again after a shrink has
// other files).
nlohmann::json holdings(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  nlohmann::json held = {{"committed", nlohmann::json::object()},
                         {"staging", nlohmann::json::object()}};
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("step_")) continue;
    std::vector<std::string> files;
    std::vector<int> ranks;
    for (const auto& file : fs::directory_iterator(entry.path(), ec)) {
      if (!file.is_regular_file()) continue;
      files.push_back(file.path().filename().string());
      if (const auto rank = record_rank(files.back())) ranks.push_back(*rank);
    }
    if (name.ends_with(".tmp")) {
      held["staging"][name] = ranks;
    } else if (fs::exists(entry.path() / kManifestFileName)) {
      const uint32_t crc = crc32c(read_whole(entry.path() / kManifestFileName));
      held["committed"][fmt::format("{}@{:08x}", name, crc)] = files;
    }
  }
  return held;
}

// One piece a node's copy lacks: a committed snapshot's file, or a written shard with its record.
struct Fetch {
  std::string dir;   // step_N or step_N.tmp
  std::string file;  // committed: the file's name
  int rank = -1;     // staging: the rank whose shard and record
  int from = 0;      // world ranks: the first node's first rank holding it, and the one lacking it
  int to = 0;
};

// The same list on every rank, in the same order: each copy's lacks, from the first that holds.
std::vector<Fetch> plan_fetches(const std::vector<int>& leads,
                                const std::vector<nlohmann::json>& held) {
  std::vector<Fetch> fetches;
  for (const char* kind : {"committed", "staging"}) {
    const bool staging = std::string(kind) == "staging";
    std::map<std::string, std::vector<size_t>> holders;  // key -> indices of leads
    for (size_t i = 0; i < leads.size(); ++i) {
      for (const auto& [key, _] : held[i].at(kind).items()) holders[key].push_back(i);
    }
    for (const auto& [key, who] : holders) {
      const std::string dir = staging ? key : key.substr(0, key.find('@'));
      std::map<std::string, size_t> first;  // entry -> the first lead holding it
      for (size_t i : who) {
        for (const auto& entry : held[i].at(kind).at(key)) first.try_emplace(entry.dump(), i);
      }
      for (const auto& [entry, source] : first) {
        for (size_t i : who) {
          const auto& mine = held[i].at(kind).at(key);
          if (std::find(mine.begin(), mine.end(), nlohmann::json::parse(entry)) != mine.end()) {
            continue;
          }
          Fetch f{.dir = dir, .file = {}, .rank = -1, .from = leads[source], .to = leads[i]};
          if (staging) {
            f.rank = nlohmann::json::parse(entry).get<int>();
          } else {
            f.file = nlohmann::json::parse(entry).get<std::string>();
          }
          fetches.push_back(std::move(f));
        }
      }
    }
  }
  return fetches;
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

std::vector<int> SnapshotReplicator::kept_with(int rank) const {
  const int node = node_of_rank_.at(size_t(rank));
  std::vector<int> kept;
  for (int r = 0; r < int(node_of_rank_.size()); ++r) {
    if (node_of_rank_[size_t(r)] == node || node_of_rank_[size_t(target(r))] == node) {
      kept.push_back(r);
    }
  }
  return kept;
}

void SnapshotReplicator::replicate(const std::filesystem::path& staging, int rank) const {
  const int to = target(rank);
  if (node_of_rank_.at(size_t(to)) == node_of_rank_.at(size_t(rank))) return;  // one node
  const Deadline deadline = CommClock::now() + timeout_;
  // One step's messages apart from another's: the staging directory names the step.
  const uint64_t tag = (std::hash<std::string>{}(staging.filename().string()) << 1) & ~kFillTag;
  const ShardCopy mine = read_shard_copy(staging, rank);
  const PostedCopy sent = post_shard_copy(*transport_, to, tag, mine);
  for (int from : sources(rank)) receive_shard_copy(*transport_, from, tag, staging, deadline);
  sent.wait(deadline);
}

void SnapshotReplicator::fill(const std::filesystem::path& root, Communicator& world) const {
  const int rank = world.rank();
  std::vector<int> leads;  // each node's first rank, in rank order
  for (int r = 0; r < int(node_of_rank_.size()); ++r) {
    if (std::find(node_of_rank_.begin(), node_of_rank_.begin() + r, node_of_rank_[size_t(r)]) ==
        node_of_rank_.begin() + r) {
      leads.push_back(r);
    }
  }
  const bool lead = std::find(leads.begin(), leads.end(), rank) != leads.end();
  const std::vector<std::string> texts =
      all_gather_strings(world, lead ? holdings(root).dump() : std::string(), timeout_);
  std::vector<nlohmann::json> held;
  for (int r : leads) held.push_back(nlohmann::json::parse(texts[size_t(r)]));
  const std::vector<Fetch> fetches = plan_fetches(leads, held);
  // In the list's order on every node: each fetch has one sender and one receiver, so the first
  // one not done always has both at it.
  for (size_t i = 0; i < fetches.size(); ++i) {
    const Fetch& f = fetches[i];
    if (rank != f.from && rank != f.to) continue;
    const Deadline deadline = CommClock::now() + timeout_;
    const uint64_t tag = kFillTag | (uint64_t(i) << 1);
    const std::filesystem::path dir = root / f.dir;
    if (f.rank >= 0) {
      if (rank == f.from) {
        const ShardCopy copy = read_shard_copy(dir, f.rank);
        post_shard_copy(*transport_, f.to, tag, copy).wait(deadline);
      } else {
        receive_shard_copy(*transport_, f.from, tag, dir, deadline);
      }
    } else if (rank == f.from) {
      const std::string bytes = read_whole(dir / f.file);
      const uint64_t size = bytes.size();
      PendingSendPtr head =
          transport_->post_send(f.to, {kReplicaContext, tag}, &size, sizeof(size));
      PendingSendPtr body =
          transport_->post_send(f.to, {kReplicaContext, tag | 1}, bytes.data(), bytes.size());
      head->wait(deadline);
      body->wait(deadline);
    } else {
      uint64_t size = 0;
      transport_->recv(f.from, {kReplicaContext, tag}, &size, sizeof(size), deadline);
      std::string bytes(size, '\0');
      transport_->recv(f.from, {kReplicaContext, tag | 1}, bytes.data(), bytes.size(), deadline);
      write_file_atomically(dir / f.file, bytes);
    }
  }
  if (lead) {
    int fetched = 0;
    for (const Fetch& f : fetches) fetched += f.to == rank ? 1 : 0;
    if (fetched > 0) {
      spdlog::info(
          "rank {}: filled this node's copy of the in-memory snapshots with {} piece(s) "
          "from the other nodes",
          rank, fetched);
    }
  }
}

}  // namespace lattice
