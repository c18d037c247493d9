// A readable account of a checkpoint, for `lattice ckpt inspect` and for logs.
#pragma once

#include <filesystem>
#include <string>

namespace lattice {

struct CheckpointReport {
  std::string text;  // step, layout, config hash, state, tensors with shards, files, status
  bool valid = false;
};

// Describes checkpoint directory `dir` (holding manifest.json); with `verify`, every file's
// size and CRC32C is checked too and the status line says what failed. A checkpoint root
// (holding step_N directories) lists its steps and `latest`, then describes the newest. A
// manifest that cannot be read at all is an IoError naming it.
CheckpointReport inspect_checkpoint(const std::filesystem::path& dir, bool verify = true);

}  // namespace lattice
