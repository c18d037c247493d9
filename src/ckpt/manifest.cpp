#include "ckpt/manifest.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>

#include "core/crc32c.h"
#include "core/error.h"

namespace lattice {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kChecksumKey = "manifest_crc32c";

// The integer field `key` of `j` as a T: a JSON integer in T's range, else ValueError naming
// the field and the value. nlohmann's get<T>() would cast a float such as 3e11 into T, which is
// undefined behaviour out of range (tests/fuzz/regressions/manifest/).
template <class T>
T integer_value(const json& v, std::string_view key) {
  if (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())) {
    return T(v.get<uint64_t>());
  }
  if (v.is_number_integer() && !v.is_number_unsigned() &&
      v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
      (std::is_unsigned_v<T> || v.get<int64_t>() <= int64_t(std::numeric_limits<T>::max()))) {
    return T(v.get<int64_t>());
  }
  LATTICE_THROW(ValueError, "field '{}' is {}, expected an integer in [{}, {}]", key, v.dump(),
                std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
}

template <class T>
T integer_field(const json& j, const char* key) {
  return integer_value<T>(j.at(key), key);
}

// The sizes of a shape or box (`key` of `j`): integers >= 0 whose product, and whose sum with
// `offsets` where given, fit int64, so the coverage arithmetic cannot overflow.
std::vector<int64_t> size_field(const json& j, const char* key,
                                const std::vector<int64_t>* offsets = nullptr) {
  const json& v = j.at(key);
  if (!v.is_array()) {
    LATTICE_THROW(ValueError, "field '{}' is {}, expected an array of integers", key, v.dump());
  }
  std::vector<int64_t> sizes;
  int64_t product = 1;
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t n = integer_value<int64_t>(v[i], key);
    int64_t end = 0;
    if (n < 0 || __builtin_mul_overflow(product, n, &product) ||
        (offsets != nullptr && i < offsets->size() &&
         __builtin_add_overflow((*offsets)[i], n, &end))) {
      LATTICE_THROW(ValueError, "field '{}' is {}: sizes must be >= 0 and within int64", key,
                    v.dump());
    }
    sizes.push_back(n);
  }
  return sizes;
}

json layout_to_json(const CheckpointLayout& l) {
  return {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"v", l.v}, {"zero", l.zero}};
}

CheckpointLayout layout_from_json(const json& j) {
  CheckpointLayout l;
  l.dp = integer_field<int>(j, "dp");
  l.tp = integer_field<int>(j, "tp");
  l.pp = integer_field<int>(j, "pp");
  l.v = integer_field<int>(j, "v");
  l.zero = integer_field<int>(j, "zero");
  return l;
}

json tensor_to_json(const TensorRecord& t) {
  json shards = json::array();
  for (const ShardRecord& s : t.shards) {
    shards.push_back(
        {{"file", s.file}, {"key", s.key}, {"offsets", s.box.offsets}, {"lengths", s.box.lengths}});
  }
  return {{"name", t.name},
          {"shape", t.shape.dims()},
          {"dtype", std::string(dtype_name(t.dtype))},
          {"shards", std::move(shards)}};
}

// Format 3 records a box; format 2 a flat range [begin, end).
ShardBox shard_box_from_json(const json& s, int format_version) {
  if (format_version == kFlatRangeCheckpointFormatVersion) {
    const int64_t begin = integer_field<int64_t>(s, "begin");
    const int64_t end = integer_field<int64_t>(s, "end");
    if (begin < 0 || end < begin) {
      LATTICE_THROW(ValueError, "shard '{}' has the range [{}, {})", s.at("key").get<std::string>(),
                    begin, end);
    }
    return ShardBox::flat(begin, end);
  }
  std::vector<int64_t> offsets = size_field(s, "offsets");
  std::vector<int64_t> lengths = size_field(s, "lengths", &offsets);
  ShardBox box{std::move(offsets), std::move(lengths)};
  if (box.offsets.size() != box.lengths.size() || box.offsets.empty()) {
    LATTICE_THROW(ValueError, "shard '{}' has {} offsets and {} lengths",
                  s.at("key").get<std::string>(), box.offsets.size(), box.lengths.size());
  }
  return box;
}

TensorRecord tensor_from_json(const json& j, int format_version) {
  TensorRecord t;
  t.name = j.at("name").get<std::string>();
  t.shape = Shape(size_field(j, "shape"));
  t.dtype = parse_dtype(j.at("dtype").get<std::string>());
  for (const json& s : j.at("shards")) {
    t.shards.push_back({s.at("file").get<std::string>(), s.at("key").get<std::string>(),
                        shard_box_from_json(s, format_version)});
  }
  return t;
}

json file_to_json(const FileRecord& f) {
  return {{"name", f.name}, {"size", f.size}, {"crc32c", f.crc32c}};
}

FileRecord file_from_json(const json& j) {
  return {j.at("name").get<std::string>(), integer_field<uint64_t>(j, "size"),
          integer_field<uint32_t>(j, "crc32c")};
}

json manifest_body(const Manifest& m) {
  json tensors = json::array(), files = json::array();
  for (const TensorRecord& t : m.tensors) tensors.push_back(tensor_to_json(t));
  for (const FileRecord& f : m.files) files.push_back(file_to_json(f));
  return {{"format_version", m.format_version}, {"step", m.step},
          {"layout", layout_to_json(m.layout)}, {"state", m.state},
          {"tensors", std::move(tensors)},      {"files", std::move(files)}};
}

}  // namespace

std::string CheckpointLayout::to_string() const {
  return fmt::format("dp={} tp={} pp={} v={} zero={}", dp, tp, pp, v, zero);
}

const TensorRecord* Manifest::find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorRecord& t, std::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

const FileRecord* Manifest::find_file(std::string_view name) const {
  for (const FileRecord& f : files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

json rank_write_result_to_json(const RankWriteResult& result) {
  json tensors = json::array();
  for (const TensorRecord& t : result.tensors) tensors.push_back(tensor_to_json(t));
  return {{"file", file_to_json(result.file)}, {"tensors", std::move(tensors)}};
}

RankWriteResult rank_write_result_from_json(const json& j) {
  RankWriteResult r;
  r.file = file_from_json(j.at("file"));
  for (const json& t : j.at("tensors")) {
    r.tensors.push_back(tensor_from_json(t, kShardedCheckpointFormatVersion));
  }
  return r;
}

void merge_rank_results(const std::vector<RankWriteResult>& results, Manifest& manifest) {
  std::map<std::string, TensorRecord> tensors;
  std::map<std::string, FileRecord> files;
  for (const RankWriteResult& r : results) {
    if (!files.emplace(r.file.name, r.file).second) {
      LATTICE_THROW(ValueError, "checkpoint file '{}' was written by two ranks", r.file.name);
    }
    for (const TensorRecord& t : r.tensors) {
      auto [it, inserted] = tensors.emplace(t.name, t);
      if (inserted) continue;
      if (it->second.shape != t.shape || it->second.dtype != t.dtype) {
        LATTICE_THROW(ValueError, "ranks disagree on tensor '{}': {} {} in one file, {} {} in '{}'",
                      t.name, dtype_name(it->second.dtype), it->second.shape.to_string(),
                      dtype_name(t.dtype), t.shape.to_string(), r.file.name);
      }
      it->second.shards.insert(it->second.shards.end(), t.shards.begin(), t.shards.end());
    }
  }
  manifest.tensors.clear();
  manifest.files.clear();
  for (auto& [name, t] : tensors) {
    std::sort(t.shards.begin(), t.shards.end(),
              [](const ShardRecord& a, const ShardRecord& b) { return a.box < b.box; });
    manifest.tensors.push_back(std::move(t));
  }
  for (auto& [name, f] : files) manifest.files.push_back(f);
  check_manifest_coverage(manifest);
}

void check_manifest_coverage(const Manifest& manifest) {
  for (const TensorRecord& t : manifest.tensors) {
    // Boxes inside the tensor, pairwise disjoint, whose sizes add up to it: an exact tiling.
    struct Part {
      ShardBox box;
      const ShardRecord* shard;
    };
    std::vector<Part> parts;
    int64_t covered = 0;
    for (const ShardRecord& s : t.shards) {
      if (manifest.find_file(s.file) == nullptr) {
        LATTICE_THROW(ValueError,
                      "tensor '{}' has a shard in '{}', which the manifest does not list", t.name,
                      s.file);
      }
      const std::string what = fmt::format("tensor '{}' {}, shard '{}' in '{}'", t.name,
                                           t.shape.to_string(), s.key, s.file);
      if (s.box.numel() <= 0) {
        LATTICE_THROW(ValueError, "{}: empty box {}", what, s.box.to_string());
      }
      for (ShardBox& box : as_tensor_boxes(s.box, t.shape, what)) {
        parts.push_back({std::move(box), &s});
      }
      // Each box lies inside the tensor, but several may add up past int64: an overlap.
      if (__builtin_add_overflow(covered, s.box.numel(), &covered)) {
        LATTICE_THROW(ValueError,
                      "tensor '{}' {} is not covered exactly once: its shards hold more than its "
                      "{} elements (an overlap)",
                      t.name, t.shape.to_string(), t.shape.numel());
      }
    }
    std::sort(parts.begin(), parts.end(),
              [](const Part& a, const Part& b) { return a.box < b.box; });
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t first_dim_end = parts[i].box.offsets[0] + parts[i].box.lengths[0];
      for (size_t j = i + 1; j < parts.size(); ++j) {
        if (parts[j].box.offsets[0] >= first_dim_end) break;  // sorted: none later overlaps
        if (intersect(parts[i].box, parts[j].box)) {
          LATTICE_THROW(ValueError,
                        "tensor '{}' {} is not covered exactly once: shard {} ('{}' in '{}') and "
                        "shard {} ('{}' in '{}') overlap",
                        t.name, t.shape.to_string(), parts[i].shard->box.to_string(),
                        parts[i].shard->key, parts[i].shard->file, parts[j].shard->box.to_string(),
                        parts[j].shard->key, parts[j].shard->file);
        }
      }
    }
    if (covered != t.shape.numel()) {
      LATTICE_THROW(ValueError,
                    "tensor '{}' {} is not covered exactly once: its shards hold {} of {} "
                    "elements (a gap)",
                    t.name, t.shape.to_string(), covered, t.shape.numel());
    }
  }
}

std::string manifest_to_text(const Manifest& manifest) {
  json body = manifest_body(manifest);
  uint32_t checksum = crc32c(body.dump());
  body[kChecksumKey] = checksum;
  return body.dump(1) + "\n";
}

Manifest manifest_from_text(const std::string& text, const fs::path& path) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {
    LATTICE_THROW(IoError,
                  "checkpoint manifest '{}' is not valid JSON ({}) ---> HINT: the file "
                  "is corrupted; resume from an older checkpoint",
                  path.string(), e.what());
  }
  try {
    if (!body.is_object() || !body.contains(kChecksumKey)) {
      LATTICE_THROW(IoError, "checkpoint manifest '{}' has no '{}' field", path.string(),
                    kChecksumKey);
    }
    uint32_t stored = integer_field<uint32_t>(body, kChecksumKey);
    body.erase(kChecksumKey);
    uint32_t actual = crc32c(body.dump());
    if (stored != actual) {
      LATTICE_THROW(IoError,
                    "checkpoint manifest '{}' fails its checksum (stored {:08x}, computed {:08x}) "
                    "---> HINT: the file is corrupted; resume from an older checkpoint",
                    path.string(), stored, actual);
    }
    Manifest m;
    m.format_version = integer_field<int>(body, "format_version");
    if (m.format_version != kShardedCheckpointFormatVersion &&
        m.format_version != kFlatRangeCheckpointFormatVersion) {
      LATTICE_THROW(IoError,
                    "checkpoint manifest '{}' has format version {}, this build reads {} and {}",
                    path.string(), m.format_version, kFlatRangeCheckpointFormatVersion,
                    kShardedCheckpointFormatVersion);
    }
    m.step = integer_field<int64_t>(body, "step");
    m.layout = layout_from_json(body.at("layout"));
    m.state = body.at("state");
    for (const json& t : body.at("tensors")) {
      m.tensors.push_back(tensor_from_json(t, m.format_version));
    }
    for (const json& f : body.at("files")) m.files.push_back(file_from_json(f));
    std::sort(m.tensors.begin(), m.tensors.end(),
              [](const TensorRecord& a, const TensorRecord& b) { return a.name < b.name; });
    check_manifest_coverage(m);
    return m;
  } catch (const json::exception& e) {
    LATTICE_THROW(IoError, "checkpoint manifest '{}' is missing or has a malformed field: {}",
                  path.string(), e.what());
  } catch (const ValueError& e) {
    LATTICE_THROW(IoError,
                  "checkpoint manifest '{}': {} ---> HINT: the manifest is corrupted or was "
                  "edited; resume from an older checkpoint",
                  path.string(), e.what());
  }
}

Manifest read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifestFileName;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    LATTICE_THROW(IoError,
                  "cannot read '{}' ---> HINT: a directory without a manifest is an unfinished "
                  "or foreign checkpoint; pick one written by `lattice train`",
                  path.string());
  }
  std::ostringstream text;
  text << in.rdbuf();
  return manifest_from_text(text.str(), path);
}

}  // namespace lattice
