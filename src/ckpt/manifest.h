// The manifest of a sharded checkpoint: manifest.json in the checkpoint directory, written last.
//
//   {"format_version": 3, "step": 1200,
//    "layout": {"dp": 1, "tp": 1, "pp": 1, "v": 1, "zero": 0},
//    "state": {...},                               training state (checkpoint.h), free-form JSON
//    "tensors": [{"name": "transformer.wte.weight", "shape": [65, 64], "dtype": "f32",
//                 "shards": [{"file": "rank_00000.safetensors",
//                             "key": "transformer.wte.weight@0:33,0:64",
//                             "offsets": [0, 0], "lengths": [33, 64]}, ...]}, ...],
//    "files": [{"name": "rank_00000.safetensors", "size": 123456, "crc32c": 3817293741}, ...],
//    "manifest_crc32c": 1234567}
//
// Format 3: a shard is a box of the global tensor (shard_box.h): per dimension [offset,
// offset + length), so a tensor-parallel shard of any dimension is one record per piece; one
// [offset, length) on a tensor of higher rank is a flat range of the tensor flattened row-major
// (a ZeRO partition of the flat store cuts those). Format 2 (still read) had flat ranges only,
// as "begin"/"end". Every tensor must be covered exactly once. "manifest_crc32c" is the CRC32C
// of the compact dump of everything else (nlohmann's dump sorts keys, so the text is a pure
// function of the contents).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/shard_box.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace lattice {

inline constexpr int kShardedCheckpointFormatVersion = 3;
inline constexpr int kFlatRangeCheckpointFormatVersion = 2;  // read only
inline constexpr const char* kManifestFileName = "manifest.json";

// The parallel layout a checkpoint was written with. Loading never requires the same one: the
// manifest maps every global tensor to its pieces, so any layout reads the slices it owns.
struct CheckpointLayout {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int v = 1;     // virtual pipeline stages per rank
  int zero = 0;  // ZeRO stage 0..3

  bool operator==(const CheckpointLayout&) const = default;
  std::string to_string() const;  // "dp=1 tp=1 pp=1 v=1 zero=0"
};

struct ShardRecord {
  std::string file;  // file name inside the checkpoint directory
  std::string key;   // tensor name inside that safetensors file (box.numel() elements)
  ShardBox box;      // which part of the global tensor

  bool operator==(const ShardRecord&) const = default;
};

struct TensorRecord {
  std::string name;  // global name
  Shape shape;       // global shape
  DType dtype = DType::kF32;
  std::vector<ShardRecord> shards;

  bool operator==(const TensorRecord&) const = default;
};

struct FileRecord {
  std::string name;
  uint64_t size = 0;
  uint32_t crc32c = 0;
};

// What one rank wrote into the staging directory: its file and the pieces in it. Gathered
// (as JSON over any transport) to the rank that commits.
struct RankWriteResult {
  FileRecord file;
  std::vector<TensorRecord> tensors;  // each with the shard(s) this file holds
};

struct Manifest {
  int format_version = kShardedCheckpointFormatVersion;
  int64_t step = 0;
  CheckpointLayout layout;
  nlohmann::json state = nlohmann::json::object();
  std::vector<TensorRecord> tensors;  // sorted by name
  std::vector<FileRecord> files;      // sorted by name

  const TensorRecord* find(std::string_view name) const;
  const FileRecord* find_file(std::string_view name) const;
};

nlohmann::json rank_write_result_to_json(const RankWriteResult& result);
RankWriteResult rank_write_result_from_json(const nlohmann::json& json);

// Merges what the ranks wrote into one manifest's tensors and files (sorted), refusing a tensor
// whose ranks disagree on shape or dtype, a file written twice, or a tensor not covered exactly
// once (ValueError naming the tensor, the gap or overlap, and the files involved).
void merge_rank_results(const std::vector<RankWriteResult>& results, Manifest& manifest);

// Every tensor's shards tile it exactly once (no gap, no overlap, none outside it) and name a
// listed file; ValueError naming the tensor, the shards and files involved otherwise.
void check_manifest_coverage(const Manifest& manifest);

// The manifest's text with its own checksum appended.
std::string manifest_to_text(const Manifest& manifest);
// Parses and verifies the checksum and coverage; IoError naming `path` and what is wrong.
Manifest manifest_from_text(const std::string& text, const std::filesystem::path& path);
// Reads <dir>/manifest.json; IoError naming the file when it is missing or invalid.
Manifest read_manifest(const std::filesystem::path& dir);

}  // namespace lattice
