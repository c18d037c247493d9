#include "ckpt/shard_reader.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "ckpt/crc32c.h"
#include "core/error.h"
#include "core/mapped_file.h"

namespace lattice {

namespace fs = std::filesystem;

CheckpointReader::CheckpointReader(fs::path dir, bool verify_checksums)
    : dir_(std::move(dir)), manifest_(read_manifest(dir_)) {
  for (const FileRecord& f : manifest_.files) verify_file(f, verify_checksums);
}

std::string CheckpointReader::tensors_in(const std::string& file) const {
  std::vector<std::string> names;
  for (const TensorRecord& t : manifest_.tensors) {
    for (const ShardRecord& s : t.shards) {
      if (s.file == file) names.push_back(t.name);
    }
  }
  constexpr size_t kListed = 4;
  std::string text;
  for (size_t i = 0; i < std::min(names.size(), kListed); ++i) {
    text += (i > 0 ? ", " : "") + names[i];
  }
  if (names.size() > kListed) text += fmt::format(" (and {} more)", names.size() - kListed);
  return text.empty() ? "no tensors" : text;
}

void CheckpointReader::verify_file(const FileRecord& file, bool verify_checksum) {
  const fs::path path = dir_ / file.name;
  const std::string hint =
      "---> HINT: the checkpoint is damaged; resume from an older one (resume_auto skips damaged "
      "ones)";
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) {
    LATTICE_THROW(IoError, "checkpoint file '{}' holding [{}] is missing ({}) {}", path.string(),
                  tensors_in(file.name), ec.message(), hint);
  }
  if (size != file.size) {
    LATTICE_THROW(IoError,
                  "checkpoint file '{}' holding [{}] has {} bytes, the manifest records {} "
                  "(truncated or overwritten) {}",
                  path.string(), tensors_in(file.name), size, file.size, hint);
  }
  if (verify_checksum) {
    MappedFile mapped(path);
    const uint32_t actual = crc32c(mapped.bytes());
    if (actual != file.crc32c) {
      LATTICE_THROW(IoError,
                    "checkpoint file '{}' holding [{}] fails its checksum (CRC32C {:08x}, the "
                    "manifest records {:08x}) {}",
                    path.string(), tensors_in(file.name), actual, file.crc32c, hint);
    }
  }
  auto reader = std::make_unique<SafetensorsReader>(path);
  for (const TensorRecord& t : manifest_.tensors) {
    for (const ShardRecord& s : t.shards) {
      if (s.file != file.name) continue;
      if (!reader->contains(s.key)) {
        LATTICE_THROW(IoError, "checkpoint file '{}' lacks '{}', the shard of tensor '{}' {}",
                      path.string(), s.key, t.name, hint);
      }
      const SafetensorsTensorInfo& info = reader->info(s.key);
      if (info.dtype != t.dtype || info.shape.numel() != s.end - s.begin) {
        LATTICE_THROW(IoError,
                      "checkpoint file '{}': shard '{}' of tensor '{}' is {} {}, the manifest "
                      "records {} with {} elements {}",
                      path.string(), s.key, t.name, dtype_name(info.dtype), info.shape.to_string(),
                      dtype_name(t.dtype), s.end - s.begin, hint);
      }
    }
  }
  files_.emplace(file.name, std::move(reader));
}

const TensorRecord& CheckpointReader::tensor(std::string_view name) const {
  const TensorRecord* t = manifest_.find(name);
  if (t == nullptr) {
    LATTICE_THROW(IoError,
                  "checkpoint '{}' has no tensor '{}' ---> HINT: `lattice ckpt inspect {}` lists "
                  "what it holds; was it written for another model?",
                  dir_.string(), name, dir_.string());
  }
  return *t;
}

void CheckpointReader::read_global(std::string_view name, const Tensor& out,
                                   DTypePolicy policy) const {
  const TensorRecord& t = tensor(name);
  if (out.shape() != t.shape) {
    LATTICE_THROW(ShapeError, "checkpoint '{}': tensor '{}' is {} {}, the destination is {}",
                  dir_.string(), t.name, dtype_name(t.dtype), t.shape.to_string(), out.describe());
  }
  read_global_elements(name, 0, t.shape.numel(), out.view(Shape{t.shape.numel()}), policy);
}

void CheckpointReader::read_global_rows(std::string_view name, int64_t row_begin, int64_t row_end,
                                        const Tensor& out, DTypePolicy policy) const {
  const TensorRecord& t = tensor(name);
  std::vector<int64_t> dims = t.shape.dims();
  if (dims.empty() || row_begin < 0 || row_end > dims[0] || row_begin > row_end) {
    LATTICE_THROW(ShapeError, "checkpoint '{}': rows [{}, {}) are outside tensor '{}' {}",
                  dir_.string(), row_begin, row_end, t.name, t.shape.to_string());
  }
  const int64_t row = dims[0] == 0 ? 0 : t.shape.numel() / dims[0];
  dims[0] = row_end - row_begin;
  if (out.shape() != Shape(dims)) {
    LATTICE_THROW(ShapeError,
                  "checkpoint '{}': rows [{}, {}) of tensor '{}' {} are {}, the destination is {}",
                  dir_.string(), row_begin, row_end, t.name, t.shape.to_string(),
                  Shape(dims).to_string(), out.describe());
  }
  read_global_elements(name, row_begin * row, row_end * row, out.view(Shape{out.numel()}), policy);
}

void CheckpointReader::read_global_elements(std::string_view name, int64_t begin, int64_t end,
                                            const Tensor& out, DTypePolicy policy) const {
  const TensorRecord& t = tensor(name);
  if (begin < 0 || end > t.shape.numel() || begin > end || out.numel() != end - begin) {
    LATTICE_THROW(ShapeError,
                  "checkpoint '{}': elements [{}, {}) of tensor '{}' {} do not fit the "
                  "destination {}",
                  dir_.string(), begin, end, t.name, t.shape.to_string(), out.describe());
  }
  if (out.dtype() != t.dtype && policy == DTypePolicy::kExact) {
    LATTICE_THROW(DTypeError,
                  "checkpoint '{}': tensor '{}' is stored as {}, the destination is {} ---> "
                  "HINT: ask for a conversion explicitly (DTypePolicy::kConvert) if that is meant",
                  dir_.string(), t.name, dtype_name(t.dtype), dtype_name(out.dtype()));
  }
  auto* dst = static_cast<std::byte*>(out.raw_data());
  const size_t out_size = dtype_size(out.dtype());
  const size_t src_size = dtype_size(t.dtype);
  // Shards are sorted by begin and tile the tensor: copy the overlap of each with [begin, end).
  for (const ShardRecord& s : t.shards) {
    const int64_t lo = std::max(begin, s.begin), hi = std::min(end, s.end);
    if (lo >= hi) continue;
    std::span<const std::byte> bytes = files_.find(s.file)->second->bytes(s.key);
    const std::byte* src = bytes.data() + size_t(lo - s.begin) * src_size;
    std::byte* to = dst + size_t(lo - begin) * out_size;
    if (out.dtype() == t.dtype) {
      std::copy_n(src, size_t(hi - lo) * src_size, to);
    } else {
      // The mapped bytes are read-only; copy_from only reads its source.
      Tensor from = Tensor::borrow(const_cast<std::byte*>(src), Shape{hi - lo}, t.dtype);
      Tensor::borrow(to, Shape{hi - lo}, out.dtype()).copy_from(from);
    }
  }
}

std::optional<ResumeChoice> resume_auto(const fs::path& root, int max_fallbacks) {
  CheckpointRoot checkpoints(root);
  std::vector<int64_t> steps = checkpoints.committed_steps();
  if (steps.empty()) return std::nullopt;
  ResumeChoice choice;
  for (int64_t step : steps) {
    const fs::path dir = checkpoints.step_dir(step);
    try {
      CheckpointReader reader(dir);
      choice.dir = dir;
      choice.step = reader.manifest().step;
      return choice;
    } catch (const IoError& e) {
      std::string why = fmt::format("{}: {}", dir.filename().string(), e.what());
      spdlog::warn("resume: skipping invalid checkpoint {}", why);
      choice.skipped.push_back(std::move(why));
    }
    if (int(choice.skipped.size()) > max_fallbacks) break;
  }
  std::string list;
  for (const std::string& s : choice.skipped) list += "\n  " + s;
  LATTICE_THROW(IoError,
                "resume: no valid checkpoint under '{}' within {} fallbacks; skipped:{}\n---> "
                "HINT: restore a checkpoint from backup, or start fresh without --resume",
                root.string(), max_fallbacks, list);
}

}  // namespace lattice
