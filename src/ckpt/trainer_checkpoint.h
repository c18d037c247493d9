// Checkpoints of a running Trainer (every rank of its mesh): what each rank writes, the manifest
// of the run, the collective save and the resharding load with the resume checks. The formats
// underneath, for a model and its optimizer: checkpoint.h.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "comm/communicator.h"
#include "train/trainer.h"

namespace lattice {

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
// Saves a running trainer into `target` (a checkpoint root's step_N, or one directory such as a
// run's "final": shard_writer.h). `world`: every rank of the run (the pp × dp × tp mesh's world
// group), each calling this at the same step; nullptr for a single rank. Each rank writes
// trainer_shards into rank_<world rank>.safetensors; world rank 0 commits (collective_save.h).
// Returns the committed directory on every rank.
std::filesystem::path save_trainer_checkpoint(const CheckpointTarget& target, Trainer& trainer,
                                              Communicator* world,
                                              const CommitOptions& options = {});

// The training file as a resume compares it: its token count and TokenFile::content_checksum.
struct TrainingFileIdentity {
  int64_t tokens = 0;
  uint32_t checksum = 0;
};
// The config keys a resume must keep, with this trainer's values: everything that changes the
// math of the steps still to come (the model, batch and sequence, the training data by its
// contents, the tokenizer, sampling, seed, LR schedule, optimizer, precision). Every key of
// train_config_keys() is either one of these or in resume_free_keys() (a test walks them).
nlohmann::json resume_keys(const Trainer& trainer);
// The same of a config whose batch is resolved; data.dir only when `data` is given.
nlohmann::json resume_keys(const TrainConfig& config, std::optional<TrainingFileIdentity> data);
// The config keys a resume may change, because they change how the steps run or what the run
// reports, not what the steps compute: the layout, threads, liveness, output, eval, sampling.
const std::vector<std::string>& resume_free_keys();

// A key whose saved value a resume would change.
struct ResumeChange {
  std::string key;
  std::string saved, now;  // the values, described (data.dir: tokens and checksum)
  std::string keep;        // the flag that keeps the saved value ("--set key=value"); "" for data
};
// The keys of `now` whose values differ from `saved` (a checkpoint's recorded resume_keys; keys
// it lacks are not compared) and are not in `allowed`.
std::vector<ResumeChange> resume_changes(const nlohmann::json& saved, const nlohmann::json& now,
                                         const std::vector<std::string>& allowed = {});

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

}  // namespace lattice
