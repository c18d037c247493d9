// Writes the binary seeds of corpus/ with the product's own writers: safetensors files, token
// files, checkpoint manifests and a cluster profile, each valid, plus near-valid variants (cut
// short, a header field off by one) that start the fuzzer at the readers' edges. The text seeds
// (TOML configs, model files) are kept by hand. Run by hand when a format changes:
//   build-fuzz/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/manifest.h"
#include "ckpt/safetensors.h"
#include "core/arena.h"
#include "core/crc32c.h"
#include "data/token_file.h"
#include "plan/cluster_profile.h"

namespace fs = std::filesystem;
using namespace lattice;

namespace {

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

void safetensors_seeds(const fs::path& dir, Arena& arena) {
  const Tensor w = Tensor::zeros(arena, Shape({2, 3}), DType::kF32);
  const Tensor b = Tensor::zeros(arena, Shape({4}), DType::kBF16);
  const Tensor h = Tensor::zeros(arena, Shape({3, 1}), DType::kF16);
  const Tensor s = Tensor::zeros(arena, Shape({}), DType::kI32);
  const Tensor e = Tensor::zeros(arena, Shape({0, 5}), DType::kF32);
  static_cast<float*>(w.raw_data())[4] = 1.5f;
  SafetensorsWriter all;
  all.add("h.0.attn.c_attn.weight", w);
  all.add("h.0.ln_1.bias", b);
  all.add("h.0.mlp.half", h);
  all.add("step", s);
  all.add("empty", e);
  all.add_metadata("format", "pt");
  all.write(dir / "four_dtypes.safetensors");
  SafetensorsWriter one;
  one.add("wte", w);
  one.write(dir / "one_tensor.safetensors");
  SafetensorsWriter none;
  none.write(dir / "no_tensors.safetensors");

  const std::string bytes = read_all(dir / "four_dtypes.safetensors");
  write_all(dir / "cut_short.safetensors", bytes.substr(0, bytes.size() - 2));
  std::string longer = bytes;
  longer[0] = char(longer[0] + 1);  // header length one past the JSON
  write_all(dir / "header_length_off.safetensors", longer);
}

void token_file_seeds(const fs::path& dir) {
  write_token_file(dir / "empty.bin", {});
  std::vector<int32_t> text;
  for (char c : std::string("ROMEO: But soft, what light through yonder window breaks?")) {
    text.push_back(int32_t(uint8_t(c)));
  }
  write_token_file(dir / "text.bin", text);
  write_token_file(dir / "gpt2_ids.bin", std::vector<int32_t>{50256, 464, 2068, 65535, 0});
  const std::string bytes = read_all(dir / "text.bin");
  write_all(dir / "cut_short.bin", bytes.substr(0, bytes.size() - 1));
  std::string v2 = bytes;
  v2[4] = 2;  // llm.c's uint32 layout
  write_all(dir / "version_2.bin", v2);
}

void manifest_seeds(const fs::path& dir) {
  Manifest m;
  m.step = 1200;
  m.layout = {.dp = 2, .tp = 2, .pp = 1, .v = 1, .zero = 1};
  m.state = {{"lr", 0.001}, {"data", {{"position", 4096}}}};
  m.files = {{"rank_00000.safetensors", 4096, 1234}, {"rank_00001.safetensors", 4096, 5678}};
  // wte split over tp along dim 0; ln_f.weight a ZeRO flat range cut in two.
  m.tensors = {{"ln_f.weight",
                Shape({2, 4}),
                DType::kF32,
                {{"rank_00000.safetensors", "ln_f.weight@0:3", ShardBox::flat(0, 3)},
                 {"rank_00001.safetensors", "ln_f.weight@3:8", ShardBox::flat(3, 8)}}},
               {"wte",
                Shape({6, 4}),
                DType::kBF16,
                {{"rank_00000.safetensors", "wte@0:3,0:4", ShardBox{{0, 0}, {3, 4}}},
                 {"rank_00001.safetensors", "wte@3:6,0:4", ShardBox{{3, 0}, {3, 4}}}}}};
  write_all(dir / "format3.json", manifest_to_text(m));

  // Format 2 (still read): flat ranges as "begin"/"end", resealed with its checksum.
  nlohmann::json j = nlohmann::json::parse(manifest_to_text(m));
  j.erase("manifest_crc32c");
  j["format_version"] = kFlatRangeCheckpointFormatVersion;
  for (auto& t : j["tensors"]) {
    int64_t begin = 0;
    for (auto& s : t["shards"]) {
      int64_t n = 1;
      for (int64_t len : s["lengths"]) n *= len;
      s.erase("offsets");
      s.erase("lengths");
      s["begin"] = begin;
      s["end"] = begin + n;
      begin += n;
    }
  }
  j["manifest_crc32c"] = crc32c(j.dump());
  write_all(dir / "format2.json", j.dump(1) + "\n");

  // Near-valid: a gap (the checksum is right, the coverage is not).
  m.tensors[1].shards.pop_back();
  m.tensors[1].shards.front().box = ShardBox{{0, 0}, {3, 4}};
  write_all(dir / "gap.json", manifest_to_text(m));
  std::string stale = read_all(dir / "format3.json");
  stale.replace(stale.find("1200"), 4, "1201");  // edited by hand: the checksum fails
  write_all(dir / "stale_checksum.json", stale);
}

void cluster_profile_seeds(const fs::path& dir) {
  write_all(dir / "dgx-h100.json", plan::write_cluster_profile(plan::cluster_preset("dgx-h100")));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const fs::path corpus = argv[1];
  for (const char* t : {"safetensors", "token_file", "manifest", "cluster_profile"}) {
    fs::create_directories(corpus / t);
  }
  Arena arena("seeds", size_t(1) << 20);
  safetensors_seeds(corpus / "safetensors", arena);
  token_file_seeds(corpus / "token_file");
  manifest_seeds(corpus / "manifest");
  cluster_profile_seeds(corpus / "cluster_profile");
  return 0;
}
