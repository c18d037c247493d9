#include "ckpt/trainer_checkpoint.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "ckpt/collective_save.h"
#include "core/error.h"

namespace lattice {

namespace fs = std::filesystem;

TrainingState trainer_state(const Trainer& trainer) {
  return TrainingState{.step = trainer.step(),
                       .lr_step = trainer.step(),
                       .data = trainer.data_position(),
                       .seed = trainer.config().seed};
}

CheckpointLayout trainer_layout(const Trainer& trainer) {
  const int pp = trainer.pp_size();
  // Under context parallelism the ZeRO shards are laid out over dp × cp (the replicas).
  return CheckpointLayout{.dp = trainer.replica_size(),
                          .tp = trainer.tp_size(),
                          .pp = pp,
                          .v = pp > 1 ? trainer.parallel().virtual_stages : 1,
                          .zero = trainer.parallel().zero};
}

nlohmann::json resume_keys(const Trainer& trainer) {
  return resume_keys(trainer.config(), trainer.train_tokens());
}

nlohmann::json resume_keys(const TrainConfig& c, std::optional<int64_t> train_tokens) {
  nlohmann::json keys = {{"batch.global_batch", c.global_batch},
                         {"batch.seq_len", c.seq_len},
                         {"data.mode", sampling_mode_name(c.data_mode)},
                         {"data.tokenizer", c.tokenizer},
                         {"train.seed", c.seed},
                         {"train.precision", c.compute_dtype == DType::kBF16 ? "bf16" : "fp32"},
                         {"optim.lr", c.lr},
                         {"optim.min_lr", c.min_lr},
                         {"optim.warmup_steps", c.warmup_steps},
                         {"optim.decay_steps", c.decay_steps},
                         {"optim.beta1", c.adam.beta1},
                         {"optim.beta2", c.adam.beta2},
                         {"optim.eps", c.adam.eps},
                         {"optim.weight_decay", c.adam.weight_decay},
                         {"optim.grad_clip", c.grad_clip}};
  if (train_tokens) keys["data.dir"] = *train_tokens;  // the training file, by its token count
  return keys;
}

Manifest trainer_manifest(Trainer& trainer) {
  Manifest manifest = training_manifest(trainer.config(), trainer.model(), trainer_state(trainer),
                                        trainer_layout(trainer));
  manifest.state["resume_keys"] = resume_keys(trainer);
  return manifest;
}

std::vector<OwnedShard> trainer_shards(Trainer& trainer, Arena& scratch) {
  return training_shards(trainer.model(), trainer.optimizer(), trainer.replica_rank(),
                         trainer.replica_size(), scratch);
}

void expect_world_of(const Trainer& trainer, int world_size) {
  const int ranks = trainer.replica_size() * trainer.tp_size() * trainer.pp_size();
  if (world_size != ranks) {
    LATTICE_THROW(ConfigError,
                  "saving a checkpoint: the world group has {} rank(s), the trainer's layout dp {} "
                  "× cp {} × tp {} × pp {} has {} ---> HINT: pass the group of every rank of the "
                  "run (DeviceMesh::world())",
                  world_size, trainer.dp_size(), trainer.cp_size(), trainer.tp_size(),
                  trainer.pp_size(), ranks);
  }
}

fs::path save_trainer_checkpoint(const CheckpointTarget& target, Trainer& trainer,
                                 Communicator* world, const CommitOptions& options) {
  const int world_size = world == nullptr ? 1 : world->size();
  expect_world_of(trainer, world_size);
  Arena scratch("ckpt-save");
  const std::vector<OwnedShard> shards = trainer_shards(trainer, scratch);
  if (world_size == 1) {
    return save_sharded_checkpoint(target, trainer_manifest(trainer), shards, options);
  }
  return save_sharded_checkpoint(target, trainer_manifest(trainer), shards, *world, options);
}

namespace {

std::string describe_key(const std::string& key, const nlohmann::json& value) {
  if (key == "data.dir") return fmt::format("a train.bin of {} tokens", value.dump());
  if (key == "optim.decay_steps") {
    return fmt::format("{} (train.steps when optim.decay_steps is unset)", value.dump());
  }
  return value.dump();
}

// ConfigError naming every key whose value differs between the checkpoint and the trainer and
// is not allowed to.
void expect_resumable(const fs::path& dir, const nlohmann::json& saved, const Trainer& trainer,
                      const ResumeOptions& options) {
  const nlohmann::json now = resume_keys(trainer);
  for (const std::string& key : options.allow_changes) {
    if (!now.contains(key)) {
      std::vector<std::string> keys;
      for (const auto& item : now.items()) keys.push_back(item.key());
      LATTICE_THROW(ConfigError,
                    "--resume-allow-change {}: not a key a resume compares ---> HINT: one of {}",
                    key, fmt::join(keys, ", "));
    }
  }
  const std::vector<ResumeChange> changes = resume_changes(saved, now, options.allow_changes);
  if (changes.empty()) return;
  std::vector<std::string> changed, hints, allows;
  for (const ResumeChange& c : changes) {
    changed.push_back(fmt::format("{}: saved {}, now {}", c.key, c.saved, c.now));
    if (!c.keep.empty()) hints.push_back(c.keep);
    allows.push_back("--resume-allow-change " + c.key);
  }
  LATTICE_THROW(ConfigError,
                "cannot resume from {}: the run would not continue the one that saved it; {} "
                "---> HINT: resume with the saved values ({}), or accept the change with {}",
                dir.string(), fmt::join(changed, "; "),
                hints.empty() ? std::string("the same training data")
                              : fmt::format("{}", fmt::join(hints, " ")),
                fmt::join(allows, " "));
}

}  // namespace

std::vector<ResumeChange> resume_changes(const nlohmann::json& saved, const nlohmann::json& now,
                                         const std::vector<std::string>& allowed) {
  std::vector<ResumeChange> changes;
  for (const auto& [key, value] : now.items()) {
    if (!saved.contains(key) || saved.at(key) == value) continue;
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    changes.push_back({.key = key,
                       .saved = describe_key(key, saved.at(key)),
                       .now = describe_key(key, value),
                       .keep = key == "data.dir"
                                   ? std::string()
                                   : fmt::format("--set {}={}", key, saved.at(key).dump())});
  }
  return changes;
}

TrainingState load_trainer_checkpoint(const fs::path& dir, Trainer& trainer,
                                      const ResumeOptions& options) {
  bool recorded = false;
  if (!is_legacy_checkpoint(dir)) {
    const Manifest manifest = read_manifest(dir);
    recorded = manifest.state.contains("resume_keys");
    if (recorded) expect_resumable(dir, manifest.state.at("resume_keys"), trainer, options);
  }
  TrainingState state = load_training_checkpoint(dir, trainer.model(), trainer.optimizer());
  trainer.set_step(state.step);
  if (recorded) {
    DataPosition position = state.data;
    // An allowed change of the sampling: the saved place in the epoch, in the new order.
    const auto allowed = [&](const char* key) {
      return std::find(options.allow_changes.begin(), options.allow_changes.end(), key) !=
             options.allow_changes.end();
    };
    if (allowed("data.mode") || allowed("train.seed")) {
      position.mode = trainer.config().data_mode;
      position.seed = trainer.config().seed;
    }
    trainer.restore_data_position(position);
  }
  return state;
}

}  // namespace lattice
