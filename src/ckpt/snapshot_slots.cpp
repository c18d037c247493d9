#include "ckpt/snapshot_slots.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <tuple>

#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "core/mapped_file.h"

namespace lattice {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSlotsDirName = "slots";
constexpr std::array<char, 8> kMagic = {'L', 'A', 'T', 'S', 'L', 'O', 'T', '1'};
// The shard file starts a page in, so that its bytes keep the alignment the tensors need.
constexpr size_t kHeaderBytes = 4096;
// Room for the manifest to grow (a longer step number, data position) without remapping.
constexpr size_t kRecordSlack = size_t(64) << 10;

enum SlotState : uint32_t { kEmpty = 0, kWriting = 1, kComplete = 2 };

// The first bytes of a slot file. Written only by its rank; `state` is the publication flag.
struct SlotHeader {
  std::array<char, 8> magic;
  uint32_t state;
  int32_t rank;
  int32_t world;
  uint32_t file_crc32c;
  int64_t generation;
  int64_t step;
  uint64_t file_bytes;
  uint64_t manifest_bytes;  // the manifest header's text, right after the file (64-aligned)
  uint64_t result_bytes;    // then the write result as JSON, its file's size and checksum unset
};
static_assert(sizeof(SlotHeader) <= kHeaderBytes);

size_t record_offset(uint64_t file_bytes) {
  return kHeaderBytes + (file_bytes + 63) / 64 * 64;
}

fs::path slots_dir(const fs::path& root) {
  return root / kSlotsDirName;
}

std::string slot_file_name(int rank, int slot) {
  return fmt::format("rank_{:05d}.slot{}", rank, slot);
}

[[noreturn]] void throw_system(const fs::path& path, std::string_view what) {
  LATTICE_THROW(IoError,
                "in-memory snapshot slot '{}': cannot {}: {} ---> HINT: the agent's shared "
                "memory (the job directory's file system, e.g. /dev/shm) must hold two copies of "
                "each rank's training state; free some or set elastic.snapshot_every = 0",
                path.string(), what, std::strerror(errno));
}

// A complete slot's header, read (not mapped) from a slot file; nullopt for anything else.
std::optional<SlotHeader> read_complete_header(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  SlotHeader header{};
  const ssize_t n = ::pread(fd, &header, sizeof(header), 0);
  ::close(fd);
  if (n != ssize_t(sizeof(header)) || header.magic != kMagic || header.state != kComplete) {
    return std::nullopt;
  }
  return header;
}

struct SlotFile {
  fs::path path;
  SlotHeader header;
};

// Every complete slot snapshot under `root`, newest first, with each rank's slot file.
std::vector<std::pair<SlotSnapshot, std::vector<fs::path>>> complete_snapshots(
    const fs::path& root) {
  using Key = std::tuple<int64_t, int64_t, int>;  // generation, step, world
  std::map<Key, std::map<int, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(slots_dir(root), ec)) {
    const std::optional<SlotHeader> h = read_complete_header(entry.path());
    if (!h || h->rank < 0 || h->rank >= h->world) continue;
    found[Key{h->generation, h->step, h->world}].emplace(h->rank, entry.path());
  }
  std::vector<std::pair<SlotSnapshot, std::vector<fs::path>>> snapshots;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    const auto& [generation, step, world] = it->first;
    if (int(it->second.size()) != world) continue;  // a rank never completed this step
    std::vector<fs::path> files;
    for (const auto& [rank, path] : it->second) files.push_back(path);
    snapshots.push_back({SlotSnapshot{generation, step, world}, std::move(files)});
  }
  return snapshots;
}

// Copies each rank's shard file out of its slot into <root>/step_N.tmp, verifying it, and
// commits them as step_N.
fs::path commit_from_slots(const CheckpointRoot& checkpoints, const SlotSnapshot& snapshot,
                           const std::vector<fs::path>& files, const CommitOptions& options) {
  const fs::path staging = checkpoints.prepare_staging(snapshot.step);
  std::optional<Manifest> manifest;
  std::vector<RankWriteResult> results;
  for (const fs::path& path : files) {
    const MappedFile slot(path);
    const std::span<const std::byte> bytes = slot.bytes();
    SlotHeader header{};
    std::memcpy(&header, bytes.data(), sizeof(header));
    const size_t record_at = record_offset(header.file_bytes);
    if (header.state != kComplete || header.step != snapshot.step ||
        bytes.size() < record_at + header.manifest_bytes + header.result_bytes) {
      LATTICE_THROW(IoError, "slot '{}' no longer holds step {} whole", path.string(),
                    snapshot.step);
    }
    const std::span<const std::byte> file = bytes.subspan(kHeaderBytes, header.file_bytes);
    if (const uint32_t crc = crc32c(file); crc != header.file_crc32c) {
      LATTICE_THROW(IoError,
                    "slot '{}' (rank {}, step {}): checksum {:08x}, written as {:08x}: the copy "
                    "in memory is corrupt",
                    path.string(), header.rank, snapshot.step, crc, header.file_crc32c);
    }
    const auto* record = reinterpret_cast<const char*>(bytes.data() + record_at);
    if (!manifest) manifest = manifest_from_text(std::string(record, header.manifest_bytes), path);
    const nlohmann::json result = nlohmann::json::parse(
        std::string_view(record + header.manifest_bytes, header.result_bytes), nullptr, false);
    if (result.is_discarded()) {
      LATTICE_THROW(IoError, "slot '{}': its write result is not JSON", path.string());
    }
    results.push_back(rank_write_result_from_json(result));
    results.back().file.size = header.file_bytes;
    results.back().file.crc32c = header.file_crc32c;
    AtomicFileWriter out(staging / results.back().file.name);
    out.write(file);
    out.commit();
  }
  return checkpoints.commit(std::move(*manifest), results, options);
}

}  // namespace

SnapshotSlotWriter::SnapshotSlotWriter(fs::path root, int rank, int64_t generation,
                                       std::function<void()> fence,
                                       std::function<void()> while_torn)
    : dir_(slots_dir(root)),
      rank_(rank),
      generation_(generation),
      fence_(std::move(fence)),
      while_torn_(std::move(while_torn)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    LATTICE_THROW(IoError, "cannot create the snapshot slots' directory '{}': {}", dir_.string(),
                  ec.message());
  }
}

SnapshotSlotWriter::~SnapshotSlotWriter() {
  for (Mapping& m : slots_) {
    if (m.base != nullptr) ::munmap(m.base, m.size);
    if (m.fd >= 0) ::close(m.fd);
  }
}

fs::path SnapshotSlotWriter::slot_path(int slot) const {
  return dir_ / slot_file_name(rank_, slot);
}

SnapshotSlotWriter::Mapping& SnapshotSlotWriter::map(int slot, size_t bytes) {
  Mapping& m = slots_[size_t(slot)];
  if (m.base != nullptr && m.size >= bytes) return m;
  const fs::path path = slot_path(slot);
  if (m.fd < 0) {
    m.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (m.fd < 0) throw_system(path, "open");
  }
  if (m.base != nullptr) ::munmap(m.base, m.size);
  m.base = nullptr;
  const size_t size = (bytes + kRecordSlack + 4095) / 4096 * 4096;
  // Allocated now, so that a full file system is this error and not a SIGBUS mid-copy.
  if (const int rc = ::posix_fallocate(m.fd, 0, off_t(size)); rc != 0) {
    errno = rc;
    throw_system(path, fmt::format("allocate {} bytes", size));
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
  if (base == MAP_FAILED) throw_system(path, "map");
  m.base = static_cast<std::byte*>(base);
  m.size = size;
  return m;
}

void SnapshotSlotWriter::reserve(const Manifest& manifest, const std::vector<OwnedShard>& shards) {
  const RankShardFile file = rank_shard_file(rank_, shards);
  result_tensors_ = file.result.tensors;
  result_text_ = rank_write_result_to_json(file.result).dump();
  const size_t bytes =
      record_offset(file.writer.size()) + manifest_to_text(manifest).size() + result_text_.size();
  for (int slot = 0; slot < 2; ++slot) {
    Mapping& m = map(slot, bytes);
    // Touched once here: the writes then find every page mapped. A slot already holding a
    // snapshot keeps it (its header is left alone).
    std::atomic_ref<uint32_t> state(reinterpret_cast<SlotHeader*>(m.base)->state);
    if (state.load(std::memory_order_acquire) != kComplete) {
      std::memset(m.base, 0, m.size);
    } else {
      for (size_t page = kHeaderBytes; page < m.size; page += 4096) {
        std::atomic_ref<std::byte>(m.base[page]).load(std::memory_order_relaxed);
      }
    }
  }
}

void SnapshotSlotWriter::write(const Manifest& manifest, const std::vector<OwnedShard>& shards) {
  RankShardFile file = rank_shard_file(rank_, shards);
  const uint64_t file_bytes = file.writer.size();
  const size_t record_at = record_offset(file_bytes);
  const std::string header_text = manifest_to_text(manifest);
  Mapping& m = map(next_, record_at + header_text.size() + result_text_.size());
  auto* header = reinterpret_cast<SlotHeader*>(m.base);
  std::atomic_ref<uint32_t> state(header->state);
  // Nothing below becomes visible before the slot is marked as being written: the acquire half
  // of this read-modify-write keeps the later writes after it. (Not a relaxed store and a
  // fence: ThreadSanitizer does not model fences, and GCC refuses them under -fsanitize=thread.)
  state.exchange(kWriting, std::memory_order_acq_rel);

  const SafetensorsFileSummary summary =
      file.writer.write_into({m.base + kHeaderBytes, file_bytes});
  if (while_torn_) while_torn_();
  // The same shards as the last write (every save of a run): the same result, not built again.
  if (file.result.tensors != result_tensors_) {
    result_tensors_ = file.result.tensors;
    result_text_ = rank_write_result_to_json(file.result).dump();
  }
  // Grows only for a longer result.
  Mapping& fitted = map(next_, record_at + header_text.size() + result_text_.size());
  header = reinterpret_cast<SlotHeader*>(fitted.base);
  std::memcpy(fitted.base + record_at, header_text.data(), header_text.size());
  std::memcpy(fitted.base + record_at + header_text.size(), result_text_.data(),
              result_text_.size());
  header->magic = kMagic;
  header->rank = rank_;
  header->world = manifest.layout.dp * manifest.layout.tp * manifest.layout.pp;
  header->file_crc32c = summary.crc32c;
  header->generation = generation_;
  header->step = manifest.step;
  header->file_bytes = file_bytes;
  header->manifest_bytes = header_text.size();
  header->result_bytes = result_text_.size();
  if (fence_) fence_();
  std::atomic_ref<uint32_t>(header->state).store(kComplete, std::memory_order_release);
  next_ = 1 - next_;
}

std::optional<SlotSnapshot> newest_slot_snapshot(const fs::path& root) {
  const auto snapshots = complete_snapshots(root);
  if (snapshots.empty()) return std::nullopt;
  return snapshots.front().first;
}

std::optional<fs::path> commit_slot_snapshot(const fs::path& root, const CommitOptions& options) {
  const CheckpointRoot checkpoints(root);
  const std::vector<int64_t> committed = checkpoints.committed_steps();
  const int64_t newest = committed.empty() ? -1 : committed.front();
  for (const auto& [snapshot, files] : complete_snapshots(root)) {
    if (snapshot.step <= newest) continue;
    try {
      return commit_from_slots(checkpoints, snapshot, files, options);
    } catch (const IoError& e) {
      spdlog::warn("the in-memory snapshot of step {} is not restored: {}", snapshot.step,
                   e.what());
      std::error_code ec;
      fs::remove_all(checkpoints.staging_dir(snapshot.step), ec);
    }
  }
  return std::nullopt;
}

void remove_slots(const fs::path& root) {
  std::error_code ec;
  fs::remove_all(slots_dir(root), ec);
}

}  // namespace lattice
