// The checkpoint manifest reader (ckpt/manifest.h) on hostile JSON. A random file almost never
// carries its own valid checksum, so each input that is a JSON object is also given the right
// "manifest_crc32c" and read again: the fields behind the checksum get fuzzed too.
#include <nlohmann/json.hpp>

#include "ckpt/manifest.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "fuzz/fuzz_target.h"

namespace {

void read_and_use(const std::string& text) {
  const lattice::Manifest m = lattice::manifest_from_text(text, "fuzz/manifest.json");
  for (const lattice::TensorRecord& t : m.tensors) {
    if (m.find(t.name) == nullptr) std::abort();  // sorted by name: every tensor is found
    for (const lattice::ShardRecord& s : t.shards) (void)m.find_file(s.file);
  }
  (void)m.layout.to_string();
}

}  // namespace

LATTICE_FUZZ_TARGET(manifest) {
  const std::string text(lattice::fuzz::as_text(input));
  try {
    read_and_use(text);
  } catch (const lattice::IoError&) {
    // refused as documented; go on with the re-checksummed text
  }
  nlohmann::json body;
  std::string resealed;
  try {
    body = nlohmann::json::parse(text);
    if (!body.is_object()) return;
    body.erase("manifest_crc32c");
    body["manifest_crc32c"] = lattice::crc32c(body.dump());
    resealed = body.dump();
  } catch (const nlohmann::json::exception&) {
    return;  // not JSON (or text nlohmann cannot dump): the first read covered it
  }
  read_and_use(resealed);
}
