#include "ckpt/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}
void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}
// A safetensors file spelled out per the spec: 8-byte little-endian length, header, data.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

class SafetensorsTest : public testing::ScratchDirTest {
 protected:
  // The IoError of opening a file with this header and data; checks it names the file.
  std::string open_error(const std::string& header, const std::string& data) {
    return open_error_bytes(safetensors_bytes(header, data));
  }
  std::string open_error_bytes(const std::string& bytes) {
    auto path = dir_ / "bad.safetensors";
    write_bytes(path, bytes);
    try {
      SafetensorsReader reader(path);
    } catch (const IoError& e) {
      std::string message = e.what();
      EXPECT_NE(message.find(path.string()), std::string::npos) << message;
      return message;
    }
    ADD_FAILURE() << "expected IoError";
    return {};
  }
  template <class T>
  Tensor filled(Shape shape, int seed) {
    Tensor t = Tensor::empty(arena_, std::move(shape), DTypeOf<T>::value);
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, int32_t>) {
        p[i] = int32_t(i * 7919 - seed);
      } else {
        p[i] = from_float<T>(float(i % 97) * 0.25f - float(seed));
      }
    }
    return t;
  }
  static bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() &&
           std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
  }

  Arena arena_{"safetensors_test", size_t(1) << 20};
};

TEST_F(SafetensorsTest, RoundTripOfEveryDType) {
  std::vector<std::pair<std::string, Tensor>> tensors{
      {"wte.weight", filled<float>({17, 5}, 1)}, {"h.0.attn.weight", filled<bf16>({3, 7, 2}, 2)},
      {"h.0.mlp.weight", filled<fp16>({9}, 3)},  {"positions", filled<int32_t>({4, 3}, 4)},
      {"scalar", filled<float>(Shape{}, 5)},     {"empty", filled<bf16>({0, 4}, 6)},
  };
  SafetensorsWriter writer;
  for (const auto& [name, t] : tensors) writer.add(name, t);
  writer.add_metadata("format", "pt");
  writer.add_metadata("lattice.step", "1200");
  auto path = dir_ / "model.safetensors";
  writer.write(path);

  SafetensorsReader reader(path);
  ASSERT_EQ(reader.tensors().size(), tensors.size());
  EXPECT_EQ(reader.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"lattice.step", "1200"}}));
  for (const auto& [name, t] : tensors) {
    const SafetensorsTensorInfo& info = reader.info(name);
    EXPECT_EQ(info.dtype, t.dtype()) << name;
    EXPECT_EQ(info.shape, t.shape()) << name;
    EXPECT_TRUE(same_bytes(reader.load(name, arena_), t)) << name;
  }
  // Names come back sorted.
  EXPECT_EQ(reader.tensors().front().name, "empty");
  EXPECT_EQ(reader.tensors().back().name, "wte.weight");
}

TEST_F(SafetensorsTest, OutputIsDeterministicAndAligned) {
  Tensor a = filled<float>({3}, 1);
  Tensor b = filled<bf16>({3}, 2);
  Tensor c = filled<fp16>({1}, 3);
  SafetensorsWriter first, second;
  first.add("b", b), first.add("c", c), first.add("a", a);
  second.add("c", c), second.add("a", a), second.add("b", b);
  first.write(dir_ / "1.safetensors");
  second.write(dir_ / "2.safetensors");
  std::string bytes = read_bytes(dir_ / "1.safetensors");
  EXPECT_EQ(bytes, read_bytes(dir_ / "2.safetensors"));
  // F32 first (4-byte elements), then the 2-byte dtypes by name; data starts 8-byte aligned.
  SafetensorsReader reader(dir_ / "1.safetensors");
  EXPECT_EQ(reader.info("a").data_begin, 0u);
  EXPECT_EQ(reader.info("b").data_begin, 12u);
  EXPECT_EQ(reader.info("c").data_begin, 18u);
  EXPECT_EQ((bytes.size() - 20) % 8, 0u);  // 12 + 6 + 2 data bytes end the file
}

// An elastic snapshot's slot holds the file's bytes written into memory: the same bytes and
// checksum as the file, size() exact, and a buffer too small refused before anything is copied.
TEST_F(SafetensorsTest, WritingIntoMemoryGivesTheFilesBytesAndChecksum) {
  Tensor a = filled<float>({5000}, 1);  // past the fused copy's 12 KiB blocks
  Tensor b = filled<bf16>({3, 7}, 2);
  SafetensorsWriter writer;
  writer.add("b", b), writer.add("a", a);
  writer.add_metadata("format", "test");
  const SafetensorsFileSummary on_disk = writer.write(dir_ / "f.safetensors");
  const std::string bytes = read_bytes(dir_ / "f.safetensors");
  ASSERT_EQ(writer.size(), bytes.size());
  std::vector<std::byte> memory(bytes.size() + 3, std::byte{0x5a});
  const SafetensorsFileSummary in_memory = writer.write_into(memory);
  EXPECT_EQ(in_memory.size, on_disk.size);
  EXPECT_EQ(in_memory.crc32c, on_disk.crc32c);
  EXPECT_EQ(std::memcmp(memory.data(), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(memory.back(), std::byte{0x5a});  // nothing past the file
  std::vector<std::byte> small(bytes.size() - 1);
  EXPECT_THROW(writer.write_into(small), ValueError);
}

// The exact bytes of a small file: header in data order, compact JSON, space padding.
TEST_F(SafetensorsTest, WriterBytesFollowTheSpec) {
  Tensor w = Tensor::empty(arena_, Shape{2}, DType::kF32);
  w.data<float>()[0] = 1.0f;
  w.data<float>()[1] = -2.0f;
  Tensor b = Tensor::empty(arena_, Shape{1}, DType::kBF16);
  b.data<bf16>()[0] = bf16(0.5f);
  SafetensorsWriter writer;
  writer.add("w", w);
  writer.add("b", b);
  writer.add_metadata("format", "pt");
  writer.write(dir_ / "x.safetensors");
  std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string data("\x00\x00\x80\x3f\x00\x00\x00\xc0\x00\x3f", 10);
  EXPECT_EQ(read_bytes(dir_ / "x.safetensors"), safetensors_bytes(header, data));
}

// Written by hand from the spec, with an unpadded header so the data sits at an odd offset.
TEST_F(SafetensorsTest, HandCraftedFileLoads) {
  const std::string header =
      R"({"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"},)"
      R"("h":{"data_offsets":[12,14],"shape":[],"dtype":"F16"},)"
      R"("i":{"dtype":"I32","shape":[1],"data_offsets":[14,18]}})";
  ASSERT_NE((8 + header.size()) % 2, 0u);
  // a = [1.0, -2.0] (f32), b = [[0.5, 3.0]] (bf16 0x3f00, 0x4040), h = 1.5 (f16 0x3e00),
  // i = [-3] (i32)
  const std::string data(
      "\x00\x00\x80\x3f\x00\x00\x00\xc0"
      "\x00\x3f\x40\x40"
      "\x00\x3e"
      "\xfd\xff\xff\xff",
      18);
  write_bytes(dir_ / "hand.safetensors", safetensors_bytes(header, data));
  SafetensorsReader reader(dir_ / "hand.safetensors");
  EXPECT_EQ(reader.metadata().at("format"), "pt");

  Tensor a = reader.load("a", arena_);
  EXPECT_EQ(a.describe(), "f32[2]");
  EXPECT_EQ(a.data<float>()[0], 1.0f);
  EXPECT_EQ(a.data<float>()[1], -2.0f);
  Tensor b = reader.load("b", arena_);
  EXPECT_EQ(b.describe(), "bf16[1, 2]");
  EXPECT_EQ(float(b.data<bf16>()[0]), 0.5f);
  EXPECT_EQ(float(b.data<bf16>()[1]), 3.0f);
  Tensor h = reader.load("h", arena_);
  EXPECT_EQ(h.shape(), Shape{});
  EXPECT_EQ(float(h.data<fp16>()[0]), 1.5f);
  EXPECT_EQ(reader.load("i", arena_).data<int32_t>()[0], -3);
  // Explicit conversion of misaligned bf16 data into f32.
  Tensor b32 = Tensor::empty(arena_, Shape{1, 2}, DType::kF32);
  reader.read("b", b32, DTypePolicy::kConvert);
  EXPECT_EQ(b32.data<float>()[1], 3.0f);
}

TEST_F(SafetensorsTest, MismatchesListExpectedAndFound) {
  SafetensorsWriter writer;
  writer.add("wte", filled<float>({4, 3}, 1));
  writer.add("ids", filled<int32_t>({2}, 1));
  writer.write(dir_ / "m.safetensors");
  SafetensorsReader reader(dir_ / "m.safetensors");

  Tensor bf = Tensor::empty(arena_, Shape{4, 3}, DType::kBF16);
  try {
    reader.read("wte", bf);
    FAIL() << "expected DTypeError";
  } catch (const DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'wte' is F32 in the file, expected BF16"),
              std::string::npos)
        << e.what();
  }
  Tensor wrong_shape = Tensor::empty(arena_, Shape{3, 4}, DType::kF32);
  try {
    reader.read("wte", wrong_shape);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("has shape [4, 3] in the file, expected [3, 4]"),
              std::string::npos)
        << e.what();
  }
  // Asked for, the float conversion rounds to nearest even.
  reader.read("wte", bf, DTypePolicy::kConvert);
  Tensor f32 = reader.load("wte", arena_);
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(bf.data<bf16>()[i].bits, bf16(f32.data<float>()[i]).bits);
  }
  // Integers never convert.
  Tensor ids_f = Tensor::empty(arena_, Shape{2}, DType::kF32);
  EXPECT_THROW(reader.read("ids", ids_f, DTypePolicy::kConvert), DTypeError);
  // A missing tensor names what is there.
  try {
    reader.info("wpe");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor 'wpe' (it holds 2: ids, wte)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(reader.contains("wpe"));
  EXPECT_TRUE(reader.contains("ids"));
}

TEST_F(SafetensorsTest, RowRangesEqualTheSliceOfTheWhole) {
  Tensor whole = filled<bf16>({10, 3, 2}, 9);
  SafetensorsWriter writer;
  writer.add("w", whole);
  writer.write(dir_ / "r.safetensors");
  SafetensorsReader reader(dir_ / "r.safetensors");
  for (auto [begin, end] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 10}, {0, 3}, {3, 7}, {9, 10}, {5, 5}}) {
    Tensor part = Tensor::empty(arena_, Shape{end - begin, 3, 2}, DType::kBF16);
    reader.read_rows("w", begin, end, part);
    EXPECT_TRUE(same_bytes(part, whole.slice_rows(begin, end))) << begin << ".." << end;
  }
  Tensor part = Tensor::empty(arena_, Shape{2, 3, 2}, DType::kBF16);
  EXPECT_THROW(reader.read_rows("w", 9, 11, part), ShapeError);
}

TEST_F(SafetensorsTest, TruncatedFilesAreReported) {
  SafetensorsWriter writer;
  writer.add("w", filled<float>({8}, 1));
  writer.write(dir_ / "good.safetensors");
  std::string good = read_bytes(dir_ / "good.safetensors");
  EXPECT_NE(open_error_bytes(good.substr(0, 5)).find("truncated: 5 bytes"), std::string::npos);
  EXPECT_NE(open_error_bytes(good.substr(0, 20)).find("runs past the end of the file"),
            std::string::npos);
  std::string message = open_error_bytes(good.substr(0, good.size() - 4));
  EXPECT_NE(message.find("tensor 'w': data_offsets [0, 32] run past the end of the 28-byte"),
            std::string::npos)
      << message;
}

// Every prefix of a valid file and every single-byte corruption of its length and header is
// either still a valid file or an IoError: never a crash, a hang or another exception type.
TEST_F(SafetensorsTest, EveryTruncationAndHeaderCorruptionIsAnIoError) {
  SafetensorsWriter writer;
  writer.add("a", filled<float>({2, 2}, 1));
  writer.add("b", filled<bf16>({3}, 2));
  writer.add_metadata("k", "v");
  writer.write(dir_ / "good.safetensors");
  const std::string good = read_bytes(dir_ / "good.safetensors");
  auto path = dir_ / "mutated.safetensors";
  for (size_t length = 0; length < good.size(); ++length) {
    write_bytes(path, good.substr(0, length));
    EXPECT_THROW(SafetensorsReader{path}, IoError) << "prefix of " << length << " bytes";
  }
  const size_t header_end = good.size() - 22;  // the data: 16 bytes of a, 6 of b
  int loaded = 0;
  for (size_t i = 0; i < header_end; ++i) {
    for (char replacement : {'\0', '9', '"'}) {
      std::string bytes = good;
      if (bytes[i] == replacement) continue;
      bytes[i] = replacement;
      write_bytes(path, bytes);
      try {
        SafetensorsReader reader(path);
        ++loaded;  // e.g. a changed metadata value or a padding byte that stays whitespace
      } catch (const IoError&) {
      }
    }
  }
  EXPECT_GT(loaded, 0);
}

TEST_F(SafetensorsTest, BadHeaderLengthIsReported) {
  std::string bytes = safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                        std::string(4, '\0'));
  bytes[7] = '\x7f';  // a length of ~9e18
  EXPECT_NE(open_error_bytes(bytes).find("header length"), std::string::npos);
  EXPECT_NE(open_error("not json at all", "").find("not valid JSON"), std::string::npos);
  EXPECT_NE(open_error("[1, 2]", "").find("expected an object"), std::string::npos);
}

TEST_F(SafetensorsTest, OverlappingOffsetsAreReported) {
  std::string message = open_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                   std::string(12, '\0'));
  EXPECT_NE(message.find("tensors 'a' [0, 8) and 'b' [4, 12) overlap"), std::string::npos)
      << message;
}

TEST_F(SafetensorsTest, HolesAndTrailingBytesAreReported) {
  EXPECT_NE(
      open_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0'))
          .find("bytes [0, 4) before tensor 'a' belong to no tensor"),
      std::string::npos);
  EXPECT_NE(
      open_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(6, '\0'))
          .find("the last 2 bytes of the data belong to no tensor"),
      std::string::npos);
}

TEST_F(SafetensorsTest, WrongDTypeStringIsReported) {
  std::string message =
      open_error(R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  EXPECT_NE(message.find("tensor 'w' has unknown dtype 'F33'"), std::string::npos) << message;
  message =
      open_error(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0'));
  EXPECT_NE(message.find("tensor 'w' has dtype F64, which Lattice does not support"),
            std::string::npos)
      << message;
}

TEST_F(SafetensorsTest, MalformedEntriesAreReported) {
  const std::string four(4, '\0');
  EXPECT_NE(open_error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", four)
                .find("tensor 'w': data_offsets [0, 4] hold 4 bytes, but F32 [2] needs 8"),
            std::string::npos);
  EXPECT_NE(open_error(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four)
                .find("tensor 'w': shape [-1]"),
            std::string::npos);
  EXPECT_NE(open_error(R"({"w":{"dtype":"F32","shape":[1]}})", four).find("'data_offsets'"),
            std::string::npos);
  EXPECT_NE(open_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", four)
                .find("end before they begin"),
            std::string::npos);
  EXPECT_NE(open_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                       four)
                .find("names 'w' twice"),
            std::string::npos);
  EXPECT_NE(open_error(R"({"__metadata__":{"step":3},"w":{"dtype":"F32","shape":[1],)"
                       R"("data_offsets":[0,4]}})",
                       four)
                .find("metadata 'step' is 3, expected a string"),
            std::string::npos);
}

TEST_F(SafetensorsTest, WriterRefusesBadNamesAndKeepsTheOldFile) {
  SafetensorsWriter writer;
  Tensor t = filled<float>({2}, 1);
  EXPECT_THROW(writer.add("", t), ValueError);
  EXPECT_THROW(writer.add("__metadata__", t), ValueError);
  writer.add("x", t);
  EXPECT_THROW(writer.add("x", t), ValueError);
  EXPECT_THROW(writer.add("undefined", Tensor()), ValueError);
  auto path = dir_ / "keep.safetensors";
  writer.write(path);
  std::string before = read_bytes(path);

  SafetensorsWriter broken;
  broken.add("bad\xff name", t);  // not UTF-8: the JSON header cannot hold it
  EXPECT_THROW(broken.write(path), ValueError);
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_THROW(writer.write(dir_ / "missing_dir" / "x.safetensors"), IoError);
}

}  // namespace
}  // namespace lattice
