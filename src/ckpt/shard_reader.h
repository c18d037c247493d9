// Loading a sharded checkpoint: verify everything first, then assemble any slice of any global
// tensor from the shards that hold it, whatever layout wrote them (resharding is just reading
// the slices the new layout owns).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/manifest.h"
#include "ckpt/safetensors.h"
#include "ckpt/shard_box.h"
#include "ckpt/shard_writer.h"

namespace lattice {

class CheckpointReader {
 public:
  // Reads and verifies the manifest (its checksum, tensors covered exactly once), then every
  // file: present, of the recorded size, with the recorded CRC32C (skipped when
  // `verify_checksums` is false, e.g. for a quick inspect), a valid safetensors header whose
  // pieces match the manifest. Any failure is an IoError naming the file and the tensors it
  // holds.
  explicit CheckpointReader(std::filesystem::path dir, bool verify_checksums = true);

  const std::filesystem::path& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  // IoError naming the tensor and the checkpoint when it is absent.
  const TensorRecord& tensor(std::string_view name) const;

  // The whole global tensor into `out`, whose shape must equal the global shape (ShapeError
  // listing both) and whose dtype must too unless `policy` is kConvert (DTypeError listing both).
  void read_global(std::string_view name, const Tensor& out,
                   DTypePolicy policy = DTypePolicy::kExact) const;
  // Rows [row_begin, row_end) along dimension 0: `out` is (row_end - row_begin, other dims).
  void read_global_rows(std::string_view name, int64_t row_begin, int64_t row_end,
                        const Tensor& out, DTypePolicy policy = DTypePolicy::kExact) const;
  // Elements [begin, end) of the flattened tensor (a ZeRO partition): `out` has end - begin.
  void read_global_elements(std::string_view name, int64_t begin, int64_t end, const Tensor& out,
                            DTypePolicy policy = DTypePolicy::kExact) const;
  // A rank's local tensor of a sharded parameter: `out` has spec.local_shape(global shape);
  // from every saved shard only its intersection with the rank's pieces is read. Padding is
  // zeroed. ShapeError when `out` has another shape.
  void read_local(std::string_view name, const ShardSpec& spec, const Tensor& out,
                  DTypePolicy policy = DTypePolicy::kExact) const;
  // Elements [begin, end) of that local tensor flattened (a ZeRO range of a tp shard).
  void read_local_elements(std::string_view name, const ShardSpec& spec, int64_t begin, int64_t end,
                           const Tensor& out, DTypePolicy policy = DTypePolicy::kExact) const;

 private:
  void verify_file(const FileRecord& file, bool verify_checksum);
  // Fills the placements (boxes of tensor `t` in the caller's memory) from the shards.
  void fill(const TensorRecord& t, const std::vector<BoxPlacement>& into, DTypePolicy policy) const;
  std::string tensors_in(const std::string& file) const;  // "a, b, c (and 12 more)"

  std::filesystem::path dir_;
  Manifest manifest_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>, std::less<>> files_;
};

// Where `resume_auto` resumes from, and what it passed over on the way.
struct ResumeChoice {
  std::filesystem::path dir;
  int64_t step = 0;
  std::vector<std::string> skipped;  // "step_300: <why>", newest first
};

// The newest step_N under `root` that verifies completely. Invalid ones (a crash after the
// rename, disk corruption) are skipped with a warning naming each and why, at most
// `max_fallbacks` times; past that an IoError lists them all. nullopt when `root` holds no
// step_N at all (a fresh run).
std::optional<ResumeChoice> resume_auto(const std::filesystem::path& root, int max_fallbacks = 2);

}  // namespace lattice
