// Training checkpoints of a model and its optimizer on top of the sharded format (manifest.h,
// shard_writer.h, shard_reader.h). A running Trainer's checkpoints: trainer_checkpoint.h;
// Hugging Face weights: hf_format.h.
//
// A checkpoint directory holds rank_NNNNN.safetensors shard files and manifest.json. The model
// is stored as fp32 master weights under their global names, the AdamW moments as
// "<name>.exp_avg" and "<name>.exp_avg_sq", and the manifest's "state" holds the step, the LR
// schedule position, the data loader position, the seed, the model config, tokenizer and
// compute dtype. Directories written by the earlier single-rank format (state.json,
// model.safetensors, optimizer.safetensors) are still read by the load functions below.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "ckpt/shard_reader.h"
#include "ckpt/shard_writer.h"
#include "core/arena.h"
#include "data/data_position.h"
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

// Everything besides tensors that a resumed run needs to continue exactly.
struct TrainingState {
  int64_t step = 0;     // optimizer updates done
  int64_t lr_step = 0;  // position in the LR schedule (LrSchedule::at(lr_step) comes next)
  DataPosition data;    // next window of the loader
  uint64_t seed = 0;    // the run's seed (Philox streams are pure functions of it and the step)

  bool operator==(const TrainingState&) const = default;
};

// The shards a single rank owning everything writes: every parameter's master weights and both
// moments, whole. ValueError for a ZeRO-sharded optimizer (moments of a range only) or a
// tensor-parallel model: those write training_shards.
std::vector<OwnedShard> model_optimizer_shards(Transformer& model, AdamW& optimizer);
// The shards one rank of a (tp × dp, ZeRO-0/1) run writes, so that every element is written
// exactly once: with a ZeRO-sharded optimizer the master weights and moments of its optimizer
// range (the owning dp rank); otherwise dp rank r of `dp_size` replicas writes the r-th
// 1/dp_size of the flat store (the replicas hold the same numbers; the write is balanced).
// Parameters replicated over tp come from tp rank 0 only; a tp shard is one box per ShardSpec
// piece (padding never saved). Pieces not contiguous in the store (c_attn's q|k|v columns) are
// copied into `scratch`; the others borrow the store.
std::vector<OwnedShard> training_shards(Transformer& model, AdamW& optimizer, int dp_rank,
                                        int dp_size, Arena& scratch);
// A manifest header (step, config hash, layout, state) for this run.
Manifest training_manifest(const TrainConfig& config, const Transformer& model,
                           const TrainingState& state, const CheckpointLayout& layout = {});

// Writes a checkpoint of a model and its optimizer into `target` (a checkpoint root's step_N,
// or one directory: shard_writer.h) by the full commit protocol.
std::filesystem::path save_training_checkpoint(const CheckpointTarget& target,
                                               const TrainConfig& config, Transformer& model,
                                               AdamW& optimizer, const TrainingState& state,
                                               const CommitOptions& options = {});

// Verifies the checkpoint, loads master weights and moments into `model` and `optimizer`
// (shapes and dtypes must match: errors list both) and returns the training state. Any layout
// loads any other: each rank reads its local shard of every parameter (all of it, also under
// ZeRO, whose master weights are replicated) and the moments of its optimizer range, from
// every saved box only the part it needs. A directory of the earlier single-rank format loads
// into a model and optimizer that hold everything (its state: the step, with lr_step = step).
TrainingState load_training_checkpoint(const std::filesystem::path& dir, Transformer& model,
                                       AdamW& optimizer);
TrainingState training_state_from_manifest(const Manifest& manifest);

// A directory of the earlier single-rank format: state.json and no manifest.
bool is_legacy_checkpoint(const std::filesystem::path& dir);
// Reads the manifest (or a legacy state.json); IoError naming the file and the fix when it is
// missing or malformed.
CheckpointInfo read_checkpoint_info(const std::filesystem::path& dir);
// The model alone (lattice sample, export): builds the model of the checkpoint and loads its
// weights (compute dtype as trained).
std::unique_ptr<Transformer> load_checkpoint_model(const std::filesystem::path& dir, Arena& arena,
                                                   CheckpointInfo* info = nullptr);

}  // namespace lattice
