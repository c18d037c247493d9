#include "ckpt/trainer_checkpoint.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "ckpt/collective_save.h"
#include "ckpt/model_config_json.h"
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
  return resume_keys(trainer.config(), TrainingFileIdentity{.tokens = trainer.train_tokens(),
                                                            .checksum = trainer.train_checksum()});
}

nlohmann::json resume_keys(const TrainConfig& c, std::optional<TrainingFileIdentity> data) {
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
  // The model: every field but its name and init_std (a resume replaces the initialization).
  // A dense model's JSON has no expert fields; n_experts 0 still tells it from a sparse one.
  const nlohmann::json model = model_config_to_json(c.model);
  for (const auto& [name, value] : model.items()) {
    if (name != "name" && name != "init_std") keys["model." + name] = value;
  }
  keys["model.n_experts"] = c.model.n_experts;
  // The training file by its contents, whatever its path.
  if (data) {
    keys["data.dir"] = {{"tokens", data->tokens},
                        {"crc32c", fmt::format("{:08x}", data->checksum)}};
  }
  return keys;
}

const std::vector<std::string>& resume_free_keys() {
  static const std::vector<std::string> keys = {
      // The model's preset only names the model.* keys, which are compared; init_std only
      // draws the initial weights, which a resume replaces.
      "model.preset", "model.init_std",
      // How the global batch (compared) is split, and how long the run goes (the LR schedule's
      // length, optim.decay_steps, is compared as resolved).
      "batch.micro_batch", "batch.micro_batches", "train.steps",
      // How fast, not what: threads, the GEMM library, the layout (any layout resumes any
      // other, equal to one rank) and the liveness of an elastic run.
      "train.threads", "train.gemm_library", "parallel.dp", "parallel.tp", "parallel.cp",
      "parallel.ep", "parallel.sp", "parallel.zero", "parallel.bucket_mb", "parallel.transport",
      "parallel.check_replicas", "parallel.pp", "parallel.schedule", "parallel.virtual_stages",
      "parallel.layers_per_chunk", "parallel.recompute", "parallel.deterministic",
      "parallel.comm_profile", "parallel.timeout_s", "elastic.heartbeat_interval_s",
      "elastic.heartbeat_timeout_s", "elastic.progress_timeout_s", "elastic.progress_factor",
      "elastic.snapshot_every", "elastic.straggler_factor",
      // What the run reports and where it writes, outside the training steps.
      "train.log_interval", "eval.interval", "eval.batches", "sample.tokens", "sample.temperature",
      "sample.prompt", "sample.seed", "output.dir", "output.checkpoint_every", "output.keep_last",
      "output.checkpoint_async"};
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

// A value as the config would write it: the config's floats are single precision, so a float
// the JSON holds as the double 0.003000000026077032 is written 0.003.
std::string value_text(const nlohmann::json& value) {
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (double(float(d)) == d) return fmt::format("{}", float(d));
  }
  return value.dump();
}

std::string describe_key(const std::string& key, const nlohmann::json& value) {
  if (key == "data.dir" && value.is_object()) {
    return fmt::format("a train.bin of {} tokens with CRC32C {}", value.at("tokens").dump(),
                       value.at("crc32c").get<std::string>());
  }
  if (key == "data.dir") return fmt::format("a train.bin of {} tokens", value.dump());
  if (key == "optim.decay_steps") {
    return fmt::format("{} (train.steps when optim.decay_steps is unset)", value_text(value));
  }
  return value_text(value);
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

// A checkpoint written before the data's checksum was recorded has its token count only.
bool same_value(const std::string& key, const nlohmann::json& saved, const nlohmann::json& now) {
  if (key == "data.dir" && saved.is_number() && now.is_object()) return saved == now.at("tokens");
  return saved == now;
}

}  // namespace

std::vector<ResumeChange> resume_changes(const nlohmann::json& saved, const nlohmann::json& now,
                                         const std::vector<std::string>& allowed) {
  std::vector<ResumeChange> changes;
  for (const auto& [key, value] : now.items()) {
    if (!saved.contains(key) || same_value(key, saved.at(key), value)) continue;
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    changes.push_back({.key = key,
                       .saved = describe_key(key, saved.at(key)),
                       .now = describe_key(key, value),
                       .keep = key == "data.dir"
                                   ? std::string()
                                   : fmt::format("--set {}={}", key, value_text(saved.at(key)))});
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
