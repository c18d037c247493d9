#include "ckpt/inspect.h"

#include <fmt/format.h>

#include "ckpt/shard_reader.h"
#include "core/error.h"

namespace lattice {

namespace fs = std::filesystem;

namespace {

void describe_manifest(const fs::path& dir, const Manifest& m, std::string& out) {
  out += fmt::format("checkpoint  {}\n", dir.string());
  out += fmt::format("step        {}\n", m.step);
  out += fmt::format("format      {}\n", m.format_version);
  out += fmt::format("layout      {}\n", m.layout.to_string());
  out += fmt::format("state       {}\n", m.state.dump());
  int64_t elements = 0;
  for (const TensorRecord& t : m.tensors) elements += t.shape.numel();
  out += fmt::format("tensors     {} ({} elements)\n", m.tensors.size(), elements);
  for (const TensorRecord& t : m.tensors) {
    out += fmt::format("  {:<48} {:>4} {:<16} {} shard{}:", t.name, dtype_name(t.dtype),
                       t.shape.to_string(), t.shards.size(), t.shards.size() == 1 ? "" : "s");
    // A box per dimension "[0:64, 32:48]"; a flat range of the flattened tensor "flat[0:4160]".
    for (const ShardRecord& s : t.shards) {
      out += fmt::format(" {}{}{}", s.file, s.box.is_flat_range_of(t.shape) ? " flat" : "",
                         s.box.to_string());
    }
    out += "\n";
  }
  uint64_t bytes = 0;
  for (const FileRecord& f : m.files) bytes += f.size;
  out += fmt::format("files       {} ({} bytes)\n", m.files.size(), bytes);
  for (const FileRecord& f : m.files) {
    out += fmt::format("  {:<32} {:>14} bytes  crc32c {:08x}\n", f.name, f.size, f.crc32c);
  }
}

}  // namespace

CheckpointReport inspect_checkpoint(const fs::path& dir, bool verify) {
  CheckpointReport report;
  fs::path target = dir;
  if (!fs::exists(dir / kManifestFileName)) {
    CheckpointRoot root(dir);
    std::vector<int64_t> steps = root.committed_steps();
    if (!steps.empty()) {
      std::optional<int64_t> latest = root.latest_step();
      report.text += fmt::format("checkpoint root {}: steps", dir.string());
      for (int64_t s : steps) report.text += fmt::format(" {}", s);
      report.text += latest ? fmt::format(", latest -> step_{}\n\n", *latest)
                            : std::string(", no latest pointer\n\n");
      target = root.step_dir(latest.value_or(steps.front()));
    }
  }
  Manifest manifest = read_manifest(target);
  describe_manifest(target, manifest, report.text);
  try {
    CheckpointReader reader(target, verify);
    report.valid = true;
    report.text += verify ? "status      valid (manifest, sizes and checksums verified)\n"
                          : "status      manifest and sizes valid (checksums not verified)\n";
  } catch (const IoError& e) {
    report.text += fmt::format("status      INVALID: {}\n", e.what());
  }
  return report;
}

}  // namespace lattice
