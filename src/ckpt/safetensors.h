// safetensors (github.com/huggingface/safetensors), the format of Hugging Face weights and of
// Lattice's checkpoint shards:
//
//   8 bytes   N, the header length, little-endian uint64
//   N bytes   a UTF-8 JSON object, padded with spaces:
//               {"__metadata__": {"key": "value", ...},          (optional, strings only)
//                "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   the rest  the data buffer; offsets are bytes relative to its start, end exclusive
//
// The tensors tile the buffer exactly: sorted by offset, the first starts at 0, each starts
// where the previous ended and the last ends at the end of the file. The reference
// implementation rejects holes and overlaps, and so does this reader. Lattice reads and writes
// F32, BF16, F16 and I32; other dtypes are named and refused.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace lattice {

// "F32", "BF16", "F16", "I32": the dtype names of the format.
std::string_view safetensors_dtype_name(DType dtype);

// What a read does when the file's dtype differs from the destination tensor's.
enum class DTypePolicy : uint8_t {
  kExact,    // refuse with a DTypeError listing both: never a silent cast
  kConvert,  // convert between float dtypes (f32, bf16, f16) with round-to-nearest-even
};

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t data_begin = 0;  // byte offsets in the data buffer, end exclusive
  uint64_t data_end = 0;

  uint64_t nbytes() const { return data_end - data_begin; }
};

// A safetensors file, mapped and validated when opened. Every problem is an IoError naming the
// file and, where there is one, the tensor: header length past the end of the file, malformed
// JSON, unknown or unsupported dtype, offsets out of range or inconsistent with dtype and shape,
// overlapping tensors, bytes that belong to no tensor.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::filesystem::path path);

  const std::filesystem::path& path() const { return file_.path(); }
  // Sorted by name.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(std::string_view name) const;
  // Throws IoError naming the file and the missing tensor.
  const SafetensorsTensorInfo& info(std::string_view name) const;
  // The tensor's bytes as stored (little-endian, row-major).
  std::span<const std::byte> bytes(std::string_view name) const;

  // Copies tensor `name` into `out`, whose shape must equal the file's (ShapeError listing
  // both otherwise) and whose dtype must too unless `policy` allows a float conversion.
  void read(std::string_view name, const Tensor& out,
            DTypePolicy policy = DTypePolicy::kExact) const;
  // Copies rows [row_begin, row_end) along dimension 0 of tensor `name` into `out`, of shape
  // (row_end - row_begin, the file's remaining dimensions): a rank's shard of a row-split
  // parameter reads only its bytes.
  void read_rows(std::string_view name, int64_t row_begin, int64_t row_end, const Tensor& out,
                 DTypePolicy policy = DTypePolicy::kExact) const;
  // A new tensor from `arena` with the file's dtype and shape, holding tensor `name`.
  Tensor load(std::string_view name, Arena& arena,
              MemoryCategory category = MemoryCategory::kParameters) const;

 private:
  void parse_header();
  void check_tiling();
  void copy_out(const SafetensorsTensorInfo& info, uint64_t byte_begin, const Shape& shape,
                const Tensor& out, DTypePolicy policy) const;

  MappedFile file_;
  uint64_t data_start_ = 0;  // 8 + N
  uint64_t data_size_ = 0;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// What write() put on disk: checkpoint manifests record both so a load can verify the file.
struct SafetensorsFileSummary {
  uint64_t size = 0;    // bytes
  uint32_t crc32c = 0;  // of all bytes, header included (ckpt/crc32c.h)
};

// Collects tensors and metadata, then writes one safetensors file. The bytes are a pure
// function of the contents: the data is laid out by descending element size, then by name (as
// the reference writer does, so every tensor starts aligned to its element size), the header
// lists __metadata__ (keys sorted) and then the tensors in data order, padded with spaces so
// the data starts 8-byte aligned. The file is written to a temporary sibling and renamed into
// place, so a crash never leaves a partial file under `path`.
class SafetensorsWriter {
 public:
  // Keeps a reference to `tensor` (not a copy): its values are read by write(). Throws
  // ValueError for an empty, reserved or repeated name, or an undefined tensor.
  void add(std::string name, const Tensor& tensor);
  void add_metadata(std::string key, std::string value);
  // The summary is computed from the bytes as they are written (no second pass over the file).
  // `reuse`: an old file to write over if it exists (AtomicFileWriter).
  SafetensorsFileSummary write(const std::filesystem::path& path,
                               const std::filesystem::path& reuse = {}) const;
  // The same bytes into memory (an elastic snapshot's shared-memory slot): `out` holds at least
  // size() bytes; the checksum rides on the copy (copy_with_crc32c).
  SafetensorsFileSummary write_into(std::span<std::byte> out) const;
  // The file's size in bytes, header included.
  uint64_t size() const;

 private:
  // The bytes before the data (the length and the padded JSON header) and the data's order.
  struct Layout {
    std::string head;
    std::vector<size_t> order;  // indices into tensors_ (a copied writer stays valid)
    uint64_t size = 0;
  };
  // Computed once (size() and write_into() share it) until the next add.
  const Layout& layout(std::string_view destination) const;

  mutable std::optional<Layout> layout_;

  std::vector<std::pair<std::string, Tensor>> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace lattice
