#include "ckpt/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <set>

#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "core/rank_progress.h"

namespace lattice {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and copied as is");

namespace {

// The reference implementation's limit: a larger header is treated as corruption, so a garbage
// length never makes the reader try to parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

// Dtypes of the format Lattice does not hold, named so the error says "unsupported" rather
// than "unknown".
constexpr std::array<std::string_view, 12> kUnsupportedDTypes{
    "F64", "I64", "U64", "U32", "I16", "U16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "C64"};

DType parse_safetensors_dtype(std::string_view name, const std::string& file,
                              const std::string& tensor) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "I32") return DType::kI32;
  if (std::find(kUnsupportedDTypes.begin(), kUnsupportedDTypes.end(), name) !=
      kUnsupportedDTypes.end()) {
    LATTICE_THROW(IoError,
                  "safetensors file '{}': tensor '{}' has dtype {}, which Lattice does not "
                  "support (supported: F32, BF16, F16, I32) ---> HINT: convert the file first",
                  file, tensor, name);
  }
  LATTICE_THROW(IoError,
                "safetensors file '{}': tensor '{}' has unknown dtype '{}' (supported: F32, "
                "BF16, F16, I32)",
                file, tensor, name);
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | uint64_t(p[i]);
  return v;
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
  }
  return "?";
}

// ---- reader ---------------------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(std::filesystem::path path) : file_(std::move(path)) {
  parse_header();
  check_tiling();
  std::sort(tensors_.begin(), tensors_.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
}

void SafetensorsReader::parse_header() {
  const std::string name = file_.path().string();
  const uint64_t size = file_.size();
  if (size < 8) {
    LATTICE_THROW(IoError,
                  "safetensors file '{}' is truncated: {} bytes, shorter than the 8-byte header "
                  "length",
                  name, size);
  }
  const uint64_t header_bytes = read_le64(file_.bytes().data());
  if (header_bytes > size - 8) {
    LATTICE_THROW(IoError,
                  "safetensors file '{}': header length {} runs past the end of the file ({} "
                  "bytes follow the length) ---> HINT: the file is truncated or not safetensors",
                  name, header_bytes, size - 8);
  }
  if (header_bytes > kMaxHeaderBytes) {
    LATTICE_THROW(IoError, "safetensors file '{}': header length {} exceeds the format's limit {}",
                  name, header_bytes, kMaxHeaderBytes);
  }
  data_start_ = 8 + header_bytes;
  data_size_ = size - data_start_;

  const char* text = reinterpret_cast<const char*>(file_.bytes().data() + 8);
  // Duplicate names would silently keep the last entry; the parser callback refuses them.
  std::set<std::string> seen;
  auto refuse_duplicates = [&](int depth, nlohmann::json::parse_event_t event,
                               nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key &&
        !seen.insert(parsed.get<std::string>()).second) {
      LATTICE_THROW(IoError, "safetensors file '{}': the header names '{}' twice", name,
                    parsed.get<std::string>());
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + header_bytes, refuse_duplicates);
  } catch (const nlohmann::json::exception& e) {
    LATTICE_THROW(IoError, "safetensors file '{}': the {}-byte header is not valid JSON: {}", name,
                  header_bytes, e.what());
  }
  if (!header.is_object()) {
    LATTICE_THROW(IoError, "safetensors file '{}': the header is a JSON {}, expected an object",
                  name, header.type_name());
  }

  for (const auto& item : header.items()) {
    // Named references, not a structured binding: the lambda below captures `key`, which
    // C++20 allows for bindings but Clang 14 does not implement.
    const std::string& key = item.key();
    const nlohmann::json& entry = item.value();
    if (key == kMetadataKey) {
      if (!entry.is_object()) {
        LATTICE_THROW(IoError, "safetensors file '{}': __metadata__ is a {}, expected an object",
                      name, entry.type_name());
      }
      for (const auto& [meta_key, value] : entry.items()) {
        if (!value.is_string()) {
          LATTICE_THROW(IoError,
                        "safetensors file '{}': metadata '{}' is {}, expected a string (the "
                        "format allows only string values)",
                        name, meta_key, value.dump());
        }
        metadata_[meta_key] = value.get<std::string>();
      }
      continue;
    }
    auto fail = [&](std::string_view what) {
      LATTICE_THROW(IoError, "safetensors file '{}': tensor '{}': {}", name, key, what);
    };
    if (!entry.is_object()) fail("the entry is not an object with dtype, shape and data_offsets");
    auto dtype = entry.find("dtype");
    auto shape = entry.find("shape");
    auto offsets = entry.find("data_offsets");
    if (dtype == entry.end() || !dtype->is_string()) fail("'dtype' is missing or not a string");
    if (shape == entry.end() || !shape->is_array()) fail("'shape' is missing or not an array");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      fail("'data_offsets' is missing or not two non-negative integers [begin, end]");
    }

    SafetensorsTensorInfo info;
    info.name = key;
    info.dtype = parse_safetensors_dtype(dtype->get<std::string>(), name, key);
    std::vector<int64_t> dims;
    uint64_t numel = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX)) {
        fail(fmt::format("shape {} has a dimension that is not a non-negative integer",
                         shape->dump()));
      }
      dims.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(numel, d.get<uint64_t>(), &numel)) {
        fail(fmt::format("shape {} overflows", shape->dump()));
      }
    }
    info.shape = Shape(std::move(dims));
    info.data_begin = (*offsets)[0].get<uint64_t>();
    info.data_end = (*offsets)[1].get<uint64_t>();
    if (info.data_begin > info.data_end) {
      fail(fmt::format("data_offsets [{}, {}] end before they begin", info.data_begin,
                       info.data_end));
    }
    if (info.data_end > data_size_) {
      fail(
          fmt::format("data_offsets [{}, {}] run past the end of the {}-byte data buffer ---> "
                      "HINT: the file is truncated",
                      info.data_begin, info.data_end, data_size_));
    }
    uint64_t expected = 0;
    if (__builtin_mul_overflow(numel, uint64_t(dtype_size(info.dtype)), &expected) ||
        expected != info.nbytes()) {
      fail(fmt::format("data_offsets [{}, {}] hold {} bytes, but {} {} needs {}", info.data_begin,
                       info.data_end, info.nbytes(), safetensors_dtype_name(info.dtype),
                       info.shape.to_string(), expected));
    }
    tensors_.push_back(std::move(info));
  }
}

void SafetensorsReader::check_tiling() {
  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return std::pair(a->data_begin, a->data_end) < std::pair(b->data_begin, b->data_end);
  });
  const std::string name = file_.path().string();
  uint64_t covered = 0;  // bytes [0, covered) belong to the tensors seen so far
  const SafetensorsTensorInfo* previous = nullptr;
  for (const auto* t : by_offset) {
    if (t->data_begin < covered) {
      LATTICE_THROW(IoError,
                    "safetensors file '{}': tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", name,
                    previous->name, previous->data_begin, previous->data_end, t->name,
                    t->data_begin, t->data_end);
    }
    if (t->data_begin > covered) {
      LATTICE_THROW(IoError,
                    "safetensors file '{}': data bytes [{}, {}) before tensor '{}' belong to no "
                    "tensor (the format requires the tensors to tile the data)",
                    name, covered, t->data_begin, t->name);
    }
    covered = t->data_end;
    previous = t;
  }
  if (covered != data_size_) {
    LATTICE_THROW(IoError,
                  "safetensors file '{}': the last {} bytes of the data belong to no tensor (the "
                  "tensors end at {}, the data at {})",
                  name, data_size_ - covered, covered, data_size_);
  }
}

bool SafetensorsReader::contains(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const auto& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name;
}

const SafetensorsTensorInfo& SafetensorsReader::info(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const auto& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) {
    std::string known;
    for (size_t i = 0; i < tensors_.size() && i < 5; ++i) {
      known += (i ? ", " : "") + tensors_[i].name;
    }
    if (tensors_.size() > 5) known += ", ...";
    LATTICE_THROW(IoError, "safetensors file '{}' has no tensor '{}' (it holds {}: {})",
                  path().string(), name, tensors_.size(), known);
  }
  return *it;
}

std::span<const std::byte> SafetensorsReader::bytes(std::string_view name) const {
  const SafetensorsTensorInfo& t = info(name);
  return file_.bytes().subspan(data_start_ + t.data_begin, t.nbytes());
}

void SafetensorsReader::read(std::string_view name, const Tensor& out, DTypePolicy policy) const {
  const SafetensorsTensorInfo& t = info(name);
  copy_out(t, t.data_begin, t.shape, out, policy);
}

void SafetensorsReader::read_rows(std::string_view name, int64_t row_begin, int64_t row_end,
                                  const Tensor& out, DTypePolicy policy) const {
  const SafetensorsTensorInfo& t = info(name);
  if (t.shape.rank() < 1) {
    LATTICE_THROW(ShapeError, "safetensors file '{}': tensor '{}' is a scalar; it has no rows",
                  path().string(), t.name);
  }
  const int64_t rows = t.shape[0];
  if (row_begin < 0 || row_end < row_begin || row_end > rows) {
    LATTICE_THROW(ShapeError,
                  "safetensors file '{}': rows [{}, {}) are outside tensor '{}' of shape {}",
                  path().string(), row_begin, row_end, t.name, t.shape.to_string());
  }
  std::vector<int64_t> dims = t.shape.dims();
  dims[0] = row_end - row_begin;
  const uint64_t row_bytes = rows == 0 ? 0 : t.nbytes() / uint64_t(rows);
  copy_out(t, t.data_begin + uint64_t(row_begin) * row_bytes, Shape(std::move(dims)), out, policy);
}

void SafetensorsReader::copy_out(const SafetensorsTensorInfo& t, uint64_t byte_begin,
                                 const Shape& shape, const Tensor& out, DTypePolicy policy) const {
  expect_defined(out, "SafetensorsReader", t.name);
  if (out.shape() != shape) {
    LATTICE_THROW(ShapeError,
                  "safetensors file '{}': tensor '{}' has shape {} in the file, expected {} (the "
                  "destination's)",
                  path().string(), t.name, shape.to_string(), out.shape().to_string());
  }
  const std::byte* src = file_.bytes().data() + data_start_ + byte_begin;
  const int64_t count = shape.numel();
  if (out.dtype() == t.dtype) {
    if (count > 0) std::memcpy(out.raw_data(), src, size_t(count) * dtype_size(t.dtype));
    return;
  }
  const bool floats = t.dtype != DType::kI32 && out.dtype() != DType::kI32;
  if (policy != DTypePolicy::kConvert || !floats) {
    LATTICE_THROW(DTypeError, "safetensors file '{}': tensor '{}' is {} in the file, expected {}{}",
                  path().string(), t.name, safetensors_dtype_name(t.dtype),
                  safetensors_dtype_name(out.dtype()),
                  floats ? " ---> HINT: ask for the conversion (DTypePolicy::kConvert) or save "
                           "the tensor in the expected dtype"
                         : " (integer and float tensors never convert)");
  }
  // The data may sit at any byte offset; convert() reads typed elements, so misaligned
  // bytes go through an aligned copy first.
  if (reinterpret_cast<uintptr_t>(src) % dtype_size(t.dtype) != 0) {
    std::vector<uint32_t> aligned((size_t(count) * dtype_size(t.dtype) + 3) / 4);
    std::memcpy(aligned.data(), src, size_t(count) * dtype_size(t.dtype));
    convert(aligned.data(), t.dtype, out.raw_data(), out.dtype(), count);
    return;
  }
  convert(src, t.dtype, out.raw_data(), out.dtype(), count);
}

Tensor SafetensorsReader::load(std::string_view name, Arena& arena, MemoryCategory category) const {
  const SafetensorsTensorInfo& t = info(name);
  Tensor out = Tensor::empty(arena, t.shape, t.dtype, category);
  read(name, out);
  return out;
}

// ---- writer ---------------------------------------------------------------------------------

void SafetensorsWriter::add(std::string name, const Tensor& tensor) {
  if (name.empty() || name == kMetadataKey) {
    LATTICE_THROW(ValueError, "safetensors: '{}' cannot name a tensor (empty or reserved)", name);
  }
  if (!tensor.defined()) {
    LATTICE_THROW(ValueError, "safetensors: tensor '{}' is undefined (no storage)", name);
  }
  for (const auto& [existing, _] : tensors_) {
    if (existing == name) {
      LATTICE_THROW(ValueError, "safetensors: tensor '{}' added twice", name);
    }
  }
  tensors_.emplace_back(std::move(name), tensor);
  layout_.reset();
}

void SafetensorsWriter::add_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
  layout_.reset();
}

const SafetensorsWriter::Layout& SafetensorsWriter::layout(std::string_view destination) const {
  if (layout_) return *layout_;
  // Data order: larger elements first, then by name, so each tensor starts aligned to its
  // element size (the data itself starts 8-byte aligned).
  Layout result;
  for (size_t i = 0; i < tensors_.size(); ++i) result.order.push_back(i);
  std::sort(result.order.begin(), result.order.end(), [this](size_t a, size_t b) {
    const auto& [name_a, tensor_a] = tensors_[a];
    const auto& [name_b, tensor_b] = tensors_[b];
    const size_t sa = dtype_size(tensor_a.dtype());
    const size_t sb = dtype_size(tensor_b.dtype());
    return sa != sb ? sa > sb : name_a < name_b;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata_) meta[key] = value;
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const size_t index : result.order) {
    const auto& [name, t] = tensors_[index];
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = safetensors_dtype_name(t.dtype());
    info["shape"] = t.shape().dims();
    info["data_offsets"] = {offset, offset + t.nbytes()};
    header[name] = std::move(info);
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    LATTICE_THROW(ValueError, "safetensors: cannot write '{}': {} (names must be UTF-8)",
                  destination, e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  result.head.resize(8);
  for (size_t i = 0; i < 8; ++i) result.head[i] = char((uint64_t(text.size()) >> (8 * i)) & 0xff);
  result.head += text;
  result.size = result.head.size() + offset;
  return layout_.emplace(std::move(result));
}

uint64_t SafetensorsWriter::size() const {
  return layout("its size").size;
}

SafetensorsFileSummary SafetensorsWriter::write(const std::filesystem::path& path,
                                                const std::filesystem::path& reuse) const {
  const Layout& bytes = layout(path.string());
  AtomicFileWriter out(path, reuse);
  SafetensorsFileSummary summary;
  auto emit = [&](const void* data, size_t size) {
    std::span<const std::byte> span(static_cast<const std::byte*>(data), size);
    out.write(span);
    summary.crc32c = crc32c_extend(summary.crc32c, span);
    summary.size += size;
  };
  emit(bytes.head.data(), bytes.head.size());
  for (const size_t index : bytes.order) {
    const Tensor& t = tensors_[index].second;
    if (t.nbytes() > 0) emit(t.raw_data(), t.nbytes());
    report_progress();  // a checkpoint of a large model takes seconds: the rank is not stuck
  }
  out.commit();
  return summary;
}

SafetensorsFileSummary SafetensorsWriter::write_into(std::span<std::byte> out) const {
  const Layout& bytes = layout("memory");
  if (out.size() < bytes.size) {
    LATTICE_THROW(ValueError, "safetensors: {} bytes do not hold a file of {}", out.size(),
                  bytes.size);
  }
  SafetensorsFileSummary summary;
  auto emit = [&](const void* data, size_t size) {
    summary.crc32c = copy_with_crc32c(summary.crc32c, {static_cast<const std::byte*>(data), size},
                                      out.data() + summary.size);
    summary.size += size;
  };
  emit(bytes.head.data(), bytes.head.size());
  for (const size_t index : bytes.order) {
    const Tensor& t = tensors_[index].second;
    if (t.nbytes() > 0) emit(t.raw_data(), t.nbytes());
    report_progress();  // a checkpoint of a large model takes seconds: the rank is not stuck
  }
  return summary;
}

}  // namespace lattice
