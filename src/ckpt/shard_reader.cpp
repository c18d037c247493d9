#include "ckpt/shard_reader.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/rank_progress.h"

namespace lattice {

namespace fs = std::filesystem;

CheckpointReader::CheckpointReader(fs::path dir, bool verify_checksums)
    : dir_(std::move(dir)), manifest_(read_manifest(dir_)) {
  for (const FileRecord& f : manifest_.files) {
    verify_file(f, verify_checksums);
    report_progress();  // a large model's files take seconds to check: the rank is not stuck
  }
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
      "---> HINT: the checkpoint is damaged; resume from an older one (`lattice train --resume "
      "auto` skips damaged ones)";
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
      if (info.dtype != t.dtype || info.shape.numel() != s.box.numel()) {
        LATTICE_THROW(IoError,
                      "checkpoint file '{}': shard '{}' of tensor '{}' is {} {}, the manifest "
                      "records {} with {} elements {}",
                      path.string(), s.key, t.name, dtype_name(info.dtype), info.shape.to_string(),
                      dtype_name(t.dtype), s.box.numel(), hint);
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
  ShardSpec whole = replicated_shard();
  fill(t, local_placements(t.shape, whole, out, begin, end), policy);
}

void CheckpointReader::read_local(std::string_view name, const ShardSpec& spec, const Tensor& out,
                                  DTypePolicy policy) const {
  const TensorRecord& t = tensor(name);
  const Shape local = spec.local_shape(t.shape);
  if (out.shape() != local) {
    LATTICE_THROW(ShapeError,
                  "checkpoint '{}': the shard ({}) of tensor '{}' {} is {}, the destination is {}",
                  dir_.string(), spec.describe(), t.name, t.shape.to_string(), local.to_string(),
                  out.describe());
  }
  read_local_elements(name, spec, 0, local.numel(), out.view(Shape{local.numel()}), policy);
}

void CheckpointReader::read_local_elements(std::string_view name, const ShardSpec& spec,
                                           int64_t begin, int64_t end, const Tensor& out,
                                           DTypePolicy policy) const {
  const TensorRecord& t = tensor(name);
  const Shape local = spec.local_shape(t.shape);
  if (begin < 0 || end > local.numel() || begin > end || out.numel() != end - begin) {
    LATTICE_THROW(ShapeError,
                  "checkpoint '{}': elements [{}, {}) of the shard ({}, {}) of tensor '{}' {} do "
                  "not fit the destination {}",
                  dir_.string(), begin, end, spec.describe(), local.to_string(), t.name,
                  t.shape.to_string(), out.describe());
  }
  if (spec.padding > 0) {  // padding is never saved
    Tensor zeroed = out;
    zeroed.zero_();
  }
  fill(t, local_placements(t.shape, spec, out, begin, end), policy);
}

void CheckpointReader::fill(const TensorRecord& t, const std::vector<BoxPlacement>& into,
                            DTypePolicy policy) const {
  if (into.empty()) return;
  const DType out_dtype = into.front().dtype;
  if (out_dtype != t.dtype && policy == DTypePolicy::kExact) {
    LATTICE_THROW(DTypeError,
                  "checkpoint '{}': tensor '{}' is stored as {}, the destination is {} ---> "
                  "HINT: ask for a conversion explicitly (DTypePolicy::kConvert) if that is meant",
                  dir_.string(), t.name, dtype_name(t.dtype), dtype_name(out_dtype));
  }
  int64_t wanted = 0, copied = 0;
  for (const BoxPlacement& to : into) wanted += to.box.numel();
  const std::vector<int64_t> dims = box_dims(t.shape);
  for (const ShardRecord& s : t.shards) {
    // The mapped bytes are read-only; copy_overlap only reads its source.
    std::span<const std::byte> bytes = files_.find(s.file)->second->bytes(s.key);
    auto* base = const_cast<std::byte*>(bytes.data());
    std::vector<BoxPlacement> from;
    if (s.box.is_flat_range_of(t.shape)) {
      // Each contiguous box of the range sits at its flat position in the shard's 1-D data.
      ShardBox whole = ShardBox::whole(t.shape);
      BoxPlacement flat = contiguous_placement(whole, nullptr, t.dtype);
      for (ShardBox& box :
           flat_range_boxes(t.shape, s.box.offsets[0], s.box.offsets[0] + s.box.lengths[0])) {
        int64_t at = 0;
        for (size_t d = 0; d < dims.size(); ++d) at += box.offsets[d] * flat.strides[d];
        from.push_back(BoxPlacement{std::move(box), flat.strides,
                                    base + size_t(at - s.box.offsets[0]) * dtype_size(t.dtype),
                                    t.dtype});
      }
    } else {
      from.push_back(contiguous_placement(s.box, base, t.dtype));
    }
    for (const BoxPlacement& src : from) {
      for (const BoxPlacement& dst : into) copied += copy_overlap(src, dst);
    }
    report_progress();
  }
  // The manifest was checked to tile every tensor exactly once, so this cannot fail unless
  // that check is broken.
  LATTICE_CHECK_EQ(copied, wanted);
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
