// Training checkpoints on top of the sharded format (manifest.h, shard_writer.h,
// shard_reader.h), and Hugging Face weights.
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
#include "train/trainer.h"

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

// Writes <root>/step_N by the full commit protocol (shard_writer.h): updates `latest`,
// prunes beyond options.keep_last.
std::filesystem::path save_training_checkpoint(const std::filesystem::path& root,
                                               const TrainConfig& config, Transformer& model,
                                               AdamW& optimizer, const TrainingState& state,
                                               const CommitOptions& options = {});
// Verifies the checkpoint, loads master weights and moments into `model` and `optimizer`
// (shapes and dtypes must match: errors list both) and returns the training state. Any layout
// loads any other: each rank reads its local shard of every parameter (all of it, also under
// ZeRO, whose master weights are replicated) and the moments of its optimizer range, from
// every saved box only the part it needs.
TrainingState load_training_checkpoint(const std::filesystem::path& dir, Transformer& model,
                                       AdamW& optimizer);
TrainingState training_state_from_manifest(const Manifest& manifest);

// A trainer's position: step, LR step, data position and seed.
TrainingState trainer_state(const Trainer& trainer);
// The layout a trainer runs with ({dp, tp, pp, v, zero}; v is 1 when pp is 1).
CheckpointLayout trainer_layout(const Trainer& trainer);
// The manifest header of a trainer's checkpoint now (step, config hash, layout, state).
Manifest trainer_manifest(Trainer& trainer);
// What this rank of a running trainer writes (training_shards of its model part): the
// parameters of its ModelPart only (a pipeline stage's layers; never the last stage's tied copy
// of the token table, which the first stage writes), from their owner over tp and dp/ZeRO.
// Pieces that are not contiguous in the store are copied into `scratch`.
std::vector<OwnedShard> trainer_shards(Trainer& trainer, Arena& scratch);
// ConfigError unless `world_size` is the trainer's dp × tp × pp.
void expect_world_of(const Trainer& trainer, int world_size);
// Saves <root>/step_N of a running trainer. `world`: every rank of the run (the pp × dp × tp
// mesh's world group), each calling this at the same step; nullptr for a single rank. Each rank
// writes trainer_shards into rank_<world rank>.safetensors; world rank 0 commits
// (collective_save.h). Returns the committed directory on every rank.
std::filesystem::path save_trainer_checkpoint(const std::filesystem::path& root, Trainer& trainer,
                                              Communicator* world,
                                              const CommitOptions& options = {});
// The same into directory `dir` itself (like save_checkpoint: a run's "final"), on every rank.
void save_trainer_checkpoint_dir(const std::filesystem::path& dir, Trainer& trainer,
                                 Communicator* world);
// The config keys a resume must keep, with this trainer's values: everything that changes the
// math of the steps still to come (batch and sequence, data stream, seed, LR schedule,
// optimizer, precision). The layout is not among them: any layout resumes any other.
nlohmann::json resume_keys(const Trainer& trainer);

struct ResumeOptions {
  // Keys of resume_keys the resumed run may change (`lattice train --resume-allow-change KEY`).
  std::vector<std::string> allow_changes;
};

// load_training_checkpoint into the trainer's model and optimizer, then trainer.set_step and
// the data position (Trainer::restore_data_position). A checkpoint that records its
// resume_keys (every one written since they exist) is first compared with the trainer's:
// ConfigError naming each key that differs with both values, unless options allow it. Every
// rank calls it (no collective: each reads what its part holds, whatever layout wrote the
// checkpoint; a pipeline stage only its layers, a tied copy of the token table the table's
// values and moments).
TrainingState load_trainer_checkpoint(const std::filesystem::path& dir, Trainer& trainer,
                                      const ResumeOptions& options = {});

// Writes the sharded format into `dir` itself (staged in "<dir>.tmp", committed with a
// manifest; an existing `dir` is replaced only once the new one is complete).
void save_checkpoint(const std::filesystem::path& dir, const TrainConfig& config,
                     Transformer& model, AdamW& optimizer, int64_t step);
// Reads the manifest (or a legacy state.json); IoError naming the file and the fix when it is
// missing or malformed.
CheckpointInfo read_checkpoint_info(const std::filesystem::path& dir);
// Builds the model of the checkpoint and loads its weights (compute dtype as trained).
std::unique_ptr<Transformer> load_checkpoint_model(const std::filesystem::path& dir, Arena& arena,
                                                   CheckpointInfo* info = nullptr);
// Loads the optimizer moments and returns the step (for resuming on one rank).
int64_t load_checkpoint_optimizer(const std::filesystem::path& dir, AdamW& optimizer);

// Loads Hugging Face GPT-2 or Llama weights (F32, BF16 or F16 tensors, widened exactly to the
// fp32 master weights) into `model`, whose config must match. `source` is a .safetensors file
// or a model directory: its config.json (when present) must agree with the model's
// architecture (ConfigError naming each key), then model.safetensors or the hub's sharded
// model.safetensors.index.json (every file its weight_map names) is read. Every expected tensor
// must be present with its exact shape; a missing, unexpected or mis-shaped tensor, or another
// dtype, is an IoError listing what was expected and what was found. GPT-2 files may omit the
// "transformer." prefix and carry the attention-mask buffers (".attn.bias", ".attn.masked_bias"),
// which are not parameters and are skipped. A pipeline stage (a model holding some layers) reads
// the tensors of its part and leaves the others to their stages; the last stage's tied copy of
// the token table reads the table.
void load_hf_weights(const std::filesystem::path& file, Transformer& model);
struct HfExportOptions {
  // Largest weight file, as transformers' save_pretrained(max_shard_size="5GB"): a larger model
  // is split into model-0000k-of-0000n.safetensors with model.safetensors.index.json.
  uint64_t max_shard_bytes = 5'000'000'000;
};
// Writes <dir>/config.json and the weights (F32, Hugging Face names): model.safetensors, or the
// hub's shards and index when they exceed options.max_shard_bytes. Weight files an earlier
// export left in <dir> are removed first.
void export_hf(const std::filesystem::path& dir, Transformer& model,
               const HfExportOptions& options = {});

}  // namespace lattice
