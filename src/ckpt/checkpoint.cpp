#include "ckpt/checkpoint.h"

#include <fmt/ranges.h>
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/collective_save.h"
#include "ckpt/flat_range.h"
#include "ckpt/model_config_json.h"
#include "ckpt/safetensors.h"
#include "core/error.h"

namespace lattice {

namespace fs = std::filesystem;

namespace {

// The earlier single-rank format (format_version 1): state.json + model.safetensors +
// optimizer.safetensors. Read only, so checkpoints written before the sharded format load.
constexpr int kLegacyFormatVersion = 1;

nlohmann::json read_legacy_state(const fs::path& dir) {
  const fs::path path = dir / "state.json";
  std::ifstream in(path);
  if (!in) LATTICE_THROW(IoError, "cannot read '{}'", path.string());
  try {
    nlohmann::json state = nlohmann::json::parse(in);
    int version = state.at("format_version").get<int>();
    if (version != kLegacyFormatVersion) {
      LATTICE_THROW(IoError, "'{}' has format version {}, this build reads version {}",
                    path.string(), version, kLegacyFormatVersion);
    }
    return state;
  } catch (const nlohmann::json::exception& e) {
    LATTICE_THROW(IoError, "'{}' is not a valid checkpoint state: {}", path.string(), e.what());
  }
}

std::string exp_avg_name(const std::string& name) {
  return name + ".exp_avg";
}
std::string exp_avg_sq_name(const std::string& name) {
  return name + ".exp_avg_sq";
}

// The moments of parameter `spec` as a tensor of its shape (views into the flat buffers).
Tensor moment_of(Tensor& flat, const ParameterSpec& spec) {
  return flat.slice_rows(spec.offset, spec.offset + spec.shape.numel()).view(spec.shape);
}

nlohmann::json state_json(const TrainConfig& config, const Transformer& model,
                          const TrainingState& state) {
  return {{"step", state.step},
          {"lr_step", state.lr_step},
          {"data_position", data_position_to_json(state.data)},
          {"seed", state.seed},
          {"model", model_config_to_json(model.config())},
          {"tokenizer", config.tokenizer},
          {"compute_dtype", std::string(dtype_name(model.compute_dtype()))}};
}

// The whole-store functions below need moments for the whole store; a ZeRO rank's optimizer
// holds only its range and goes through flat_range.h instead.
void expect_whole_store_moments(AdamW& optimizer, std::string_view op) {
  const int64_t total = optimizer.store().registry().total_elements();
  if (optimizer.m().numel() != total || optimizer.v().numel() != total) {
    LATTICE_THROW(ValueError,
                  "{}: the optimizer holds moments for {} of {} store elements (ZeRO-sharded) "
                  "---> HINT: write and read its range with flat_range_shards / read_flat_range",
                  op, optimizer.m().numel(), total);
  }
}

CheckpointInfo info_from_state(const nlohmann::json& state, const fs::path& file) {
  try {
    CheckpointInfo info;
    info.model = model_config_from_json(state.at("model"));
    info.tokenizer = state.at("tokenizer").get<std::string>();
    info.compute_dtype = parse_dtype(state.at("compute_dtype").get<std::string>());
    info.step = state.at("step").get<int64_t>();
    info.seed = state.at("seed").get<uint64_t>();
    return info;
  } catch (const nlohmann::json::exception& e) {
    LATTICE_THROW(IoError, "'{}' is missing a field: {}", file.string(), e.what());
  }
}

// The earlier single-rank format into a model and optimizer that hold everything.
TrainingState load_legacy_checkpoint(const fs::path& dir, Transformer& model, AdamW& optimizer) {
  expect_whole_store_moments(optimizer, "loading a format-1 checkpoint");
  expect_unsharded_model(model.registry(), "loading a format-1 checkpoint",
                         "load it on one rank and save it again in the sharded format");
  const CheckpointInfo info = info_from_state(read_legacy_state(dir), dir / "state.json");
  ParameterStore& store = model.parameters();
  const auto& specs = model.registry().specs();
  SafetensorsReader weights(dir / "model.safetensors");
  for (int i = 0; i < int(specs.size()); ++i) weights.read(specs[size_t(i)].name, store.master(i));
  store.refresh_compute_copy();
  SafetensorsReader moments(dir / "optimizer.safetensors");
  for (const ParameterSpec& spec : specs) {
    moments.read(exp_avg_name(spec.name), moment_of(optimizer.m(), spec));
    moments.read(exp_avg_sq_name(spec.name), moment_of(optimizer.v(), spec));
  }
  TrainingState state;
  state.step = info.step;
  state.lr_step = info.step;
  state.seed = info.seed;
  optimizer.set_steps_taken(state.step);
  return state;
}

}  // namespace

bool is_legacy_checkpoint(const fs::path& dir) {
  return !fs::exists(dir / kManifestFileName) && fs::exists(dir / "state.json");
}

std::vector<OwnedShard> model_optimizer_shards(Transformer& model, AdamW& optimizer) {
  expect_whole_store_moments(optimizer, "model_optimizer_shards");
  expect_unsharded_model(model.registry(), "model_optimizer_shards",
                         "write training_shards on every rank (save_trainer_checkpoint)");
  ParameterStore& store = model.parameters();
  const auto& specs = model.registry().specs();
  std::vector<OwnedShard> shards;
  shards.reserve(specs.size() * 3);
  for (int i = 0; i < int(specs.size()); ++i) {
    const ParameterSpec& spec = specs[size_t(i)];
    shards.push_back(OwnedShard::whole(spec.name, store.master(i)));
    shards.push_back(OwnedShard::whole(exp_avg_name(spec.name), moment_of(optimizer.m(), spec)));
    shards.push_back(OwnedShard::whole(exp_avg_sq_name(spec.name), moment_of(optimizer.v(), spec)));
  }
  return shards;
}

std::vector<OwnedShard> training_shards(Transformer& model, AdamW& optimizer, int dp_rank,
                                        int dp_size, Arena& scratch) {
  ParameterStore& store = model.parameters();
  const ParameterRegistry& registry = model.registry();
  // A sharded optimizer's range is this dp rank's to write (ZeRO-1: every range has exactly one
  // owner). Replicas of an unsharded one hold the same numbers: each writes its 1/dp of the
  // flat store, so that no rank writes (and stalls on) the whole state for all of them.
  // Under expert parallelism the experts' parameters differ between the ep ranks: each is written
  // by the dp ranks holding the same experts, 1/(dp/ep) of the store each (ZeRO-0) or their
  // owned shard (ZeRO-1, sharded over those ranks), the dense ones as without it under ZeRO-0,
  // and under ZeRO-1 by the owners among the ranks of ep rank 0 (each group of ranks holding
  // the same experts owns every dense element once).
  const ExpertLayout& ep = registry.expert_parallel();
  const bool split_experts = ep.size > 1;
  std::vector<OwnedShard> shards;
  for (const bool experts : {false, true}) {
    if (experts && !split_experts) break;
    const int writers = experts ? dp_size / ep.size : dp_size;
    const int writer = experts ? dp_rank / ep.size : dp_rank;
    int64_t begin = optimizer.shard_begin();
    int64_t end = optimizer.shard_end();
    int64_t moments_from = 0;
    if (optimizer.sharded()) {
      if (split_experts && !experts && ep.rank != 0) continue;
    } else if (writers > 1) {
      const int64_t total = end - begin;
      begin = total * writer / writers;
      end = total * (writer + 1) / writers;
      moments_from = begin;
    }
    auto moments = [&](Tensor& flat) {
      return flat.view(Shape{flat.numel()}).slice_rows(moments_from, moments_from + end - begin);
    };
    const bool with_replicated = registry.tensor_parallel().rank == 0;
    auto keep = [&](const ParameterSpec& spec) { return spec.expert == experts; };
    std::vector<OwnedShard> part = flat_range_shards(
        registry, store.master(), moments(optimizer.m()), moments(optimizer.v()), begin, end,
        &scratch, with_replicated,
        split_experts ? std::function<bool(const ParameterSpec&)>(keep) : nullptr);
    for (OwnedShard& s : part) shards.push_back(std::move(s));
  }
  return shards;
}

Manifest training_manifest(const TrainConfig& config, const Transformer& model,
                           const TrainingState& state, const CheckpointLayout& layout) {
  Manifest manifest;
  manifest.step = state.step;
  manifest.layout = layout;
  manifest.state = state_json(config, model, state);
  return manifest;
}

fs::path save_training_checkpoint(const CheckpointTarget& target, const TrainConfig& config,
                                  Transformer& model, AdamW& optimizer, const TrainingState& state,
                                  const CommitOptions& options) {
  return save_sharded_checkpoint(target, training_manifest(config, model, state),
                                 model_optimizer_shards(model, optimizer), options);
}

TrainingState training_state_from_manifest(const Manifest& manifest) {
  try {
    const nlohmann::json& s = manifest.state;
    TrainingState state;
    state.step = s.at("step").get<int64_t>();
    state.lr_step = s.at("lr_step").get<int64_t>();
    state.data = data_position_from_json(s.at("data_position"));
    state.seed = s.at("seed").get<uint64_t>();
    return state;
  } catch (const nlohmann::json::exception& e) {
    LATTICE_THROW(IoError, "checkpoint manifest at step {} lacks training state: {}", manifest.step,
                  e.what());
  }
}

TrainingState load_training_checkpoint(const fs::path& dir, Transformer& model, AdamW& optimizer) {
  if (is_legacy_checkpoint(dir)) return load_legacy_checkpoint(dir, model, optimizer);
  CheckpointReader reader(dir);
  ParameterStore& store = model.parameters();
  const ParameterRegistry& registry = model.registry();
  const auto& specs = registry.specs();
  // ZeRO-3 holds the master weights of its optimizer range only; read them like the moments.
  const FlatRange held = store.master_range();
  const bool whole_master = held.begin == 0 && held.end == registry.total_elements();
  if (whole_master) {
    for (int i = 0; i < int(specs.size()); ++i) {
      const ParameterSpec& spec = specs[size_t(i)];
      reader.read_local(spec.name, spec.shard, store.master(i));
    }
  }
  // The moments of the optimizer's range (the whole store unless ZeRO shards it).
  const int64_t begin = optimizer.shard_begin(), end = optimizer.shard_end();
  LATTICE_CHECK(whole_master || (held.begin == begin && held.end == end),
                "ZeRO-3 master range [{}, {}) is not the optimizer's [{}, {})", held.begin,
                held.end, begin, end);
  auto range_of = [](Tensor& flat, int64_t first, int64_t lo, int64_t hi) {
    return flat.view(Shape{flat.numel()}).slice_rows(lo - first, hi - first);
  };
  for (const ParameterSpec& spec : specs) {
    const int64_t lo = std::max(begin, spec.offset);
    const int64_t hi = std::min(end, spec.offset + spec.local_shape.numel());
    if (lo >= hi) continue;
    const int64_t a = lo - spec.offset, b = hi - spec.offset;
    if (!whole_master) {
      reader.read_local_elements(spec.name, spec.shard, a, b,
                                 range_of(store.master(), begin, lo, hi));
    }
    reader.read_local_elements(exp_avg_name(spec.name), spec.shard, a, b,
                               range_of(optimizer.m(), begin, lo, hi));
    reader.read_local_elements(exp_avg_sq_name(spec.name), spec.shard, a, b,
                               range_of(optimizer.v(), begin, lo, hi));
  }
  store.refresh_compute_copy();
  if (store.replicated_values()) {
    // ZeRO-1/2 under bf16: every rank's compute copy and f32 copies hold the whole model.
    Arena scratch("load");
    for (int i = 0; i < int(specs.size()); ++i) {
      const ParameterSpec& spec = specs[size_t(i)];
      Tensor values = Tensor::zeros(scratch, spec.local_shape, DType::kF32, MemoryCategory::kOther);
      reader.read_local(spec.name, spec.shard, values);
      store.set_replicated_values(i, values);
    }
  }
  TrainingState state = training_state_from_manifest(reader.manifest());
  optimizer.set_steps_taken(state.step);
  return state;
}

CheckpointInfo read_checkpoint_info(const fs::path& dir) {
  if (is_legacy_checkpoint(dir)) return info_from_state(read_legacy_state(dir), dir / "state.json");
  return info_from_state(read_manifest(dir).state, dir / kManifestFileName);
}

std::unique_ptr<Transformer> load_checkpoint_model(const fs::path& dir, Arena& arena,
                                                   CheckpointInfo* info_out) {
  CheckpointInfo info = read_checkpoint_info(dir);
  auto model = std::make_unique<Transformer>(info.model, arena, info.compute_dtype);
  ParameterStore& store = model->parameters();
  const auto& specs = model->registry().specs();
  if (is_legacy_checkpoint(dir)) {
    SafetensorsReader reader(dir / "model.safetensors");
    for (int i = 0; i < int(specs.size()); ++i) reader.read(specs[size_t(i)].name, store.master(i));
  } else {
    CheckpointReader reader(dir);
    for (int i = 0; i < int(specs.size()); ++i) {
      reader.read_global(specs[size_t(i)].name, store.master(i));
    }
  }
  store.refresh_compute_copy();
  if (info_out != nullptr) *info_out = info;
  return model;
}

}  // namespace lattice
