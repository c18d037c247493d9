// Single-rank checkpoints and Hugging Face weights.
//
// A checkpoint is a directory:
//   model.safetensors      fp32 master weights under their global names
//   optimizer.safetensors  AdamW moments: "<name>.exp_avg", "<name>.exp_avg_sq"
//   state.json             format version, step, model config, tokenizer, precision, seed
// It is written into "<dir>.tmp" and renamed into place, so a crash leaves the previous
// checkpoint (if any) intact. (Sharded, resharding checkpoints are a later layer of ckpt/.)
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "core/arena.h"
#include "model/transformer.h"
#include "train/optimizer.h"
#include "train/train_config.h"

namespace lattice {

inline constexpr int kCheckpointFormatVersion = 1;

struct CheckpointInfo {
  ModelConfig model;
  std::string tokenizer = "byte";
  DType compute_dtype = DType::kF32;
  int64_t step = 0;
  uint64_t seed = 0;
};

void save_checkpoint(const std::filesystem::path& dir, const TrainConfig& config,
                     Transformer& model, AdamW& optimizer, int64_t step);
// Reads state.json; IoError naming the file and the fix when it is missing or malformed.
CheckpointInfo read_checkpoint_info(const std::filesystem::path& dir);
// Builds the model of the checkpoint and loads its weights (compute dtype as trained).
std::unique_ptr<Transformer> load_checkpoint_model(const std::filesystem::path& dir, Arena& arena,
                                                   CheckpointInfo* info = nullptr);
// Loads the optimizer moments and returns the step (for resuming on one rank).
int64_t load_checkpoint_optimizer(const std::filesystem::path& dir, AdamW& optimizer);

// Loads Hugging Face GPT-2 or Llama weights (F32, BF16 or F16 tensors, widened exactly to the
// fp32 master weights) into `model`, whose config must match. Every expected tensor must be
// present with its exact shape; a missing, unexpected or mis-shaped tensor, or another dtype,
// is an IoError listing what was expected and what was found. GPT-2 files may omit the
// "transformer." prefix and carry the attention-mask buffers (".attn.bias", ".attn.masked_bias"),
// which are not parameters and are skipped.
void load_hf_weights(const std::filesystem::path& file, Transformer& model);
// Writes <dir>/model.safetensors (F32, Hugging Face names) and <dir>/config.json.
void export_hf(const std::filesystem::path& dir, Transformer& model);

}  // namespace lattice
