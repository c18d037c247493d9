// A tiny training run through the executable, for the commands that read what it leaves: its
// final checkpoint (export, sample, ckpt inspect) and its metrics.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/cli_run.h"
#include "support/scratch_dir.h"
#include "train/test_corpus.h"

namespace lattice::testing {

struct TinyRun {
  std::filesystem::path config;     // write_tiny_config's TOML, beside the corpus
  std::filesystem::path out;        // output.dir
  std::filesystem::path final_dir;  // out/final, the last checkpoint
  std::filesystem::path metrics;    // JSON lines, one per step
  CliResult result;
};

// `lattice train` of the tiny config for `steps` steps (validation after the last), into fresh
// scratch directories named after `name`. The caller asserts on result.exit_code.
inline TinyRun train_tiny_run(const std::string& name, int steps = 2) {
  TinyRun run;
  const auto data = make_corpus_dir(name, 8000, 2000);
  run.config = write_tiny_config(data, steps, "[eval]\nbatches = 2\n");
  run.out = scratch_dir(name + "_out");
  run.final_dir = run.out / "final";
  run.metrics = run.out / "metrics.jsonl";
  run.result = run_cli(train_args(run.config, run.out, {"--metrics", run.metrics.string()}), 120);
  return run;
}

// Flips one byte in the middle of a tensor file (*.safetensors) of checkpoint `dir`; returns the
// file, or an empty path if there is none.
inline std::filesystem::path corrupt_a_tensor_file(const std::filesystem::path& dir) {
  std::filesystem::path shard;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") shard = entry.path();
  }
  if (shard.empty()) return shard;
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff middle = f.tellg() / 2;
  f.seekg(middle);
  const char byte = char(f.get() ^ 0x5a);
  f.seekp(middle);
  f.put(byte);
  return shard;
}

}  // namespace lattice::testing
