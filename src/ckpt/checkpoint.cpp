#include "ckpt/checkpoint.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/model_config_json.h"
#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "core/error.h"

namespace lattice {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) {
    LATTICE_THROW(IoError,
                  "cannot read '{}' ---> HINT: is this a checkpoint directory written by "
                  "`lattice train` (it holds state.json, model.safetensors)?",
                  path.string());
  }
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    LATTICE_THROW(IoError, "'{}' is not valid JSON: {}", path.string(), e.what());
  }
}

void write_text(const fs::path& path, const std::string& text) {
  AtomicFileWriter writer(path);
  writer.write(text.data(), text.size());
  writer.commit();
}

}  // namespace

void save_checkpoint(const fs::path& dir, const TrainConfig& config, Transformer& model,
                     AdamW& optimizer, int64_t step) {
  const fs::path tmp = dir.string() + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  ParameterStore& store = model.parameters();
  const auto& specs = model.registry().specs();

  SafetensorsWriter weights;
  weights.add_metadata("format", "lattice-single-rank");
  for (int i = 0; i < int(specs.size()); ++i) weights.add(specs[size_t(i)].name, store.master(i));
  weights.write(tmp / "model.safetensors");

  SafetensorsWriter moments;
  for (int i = 0; i < int(specs.size()); ++i) {
    const ParameterSpec& spec = specs[size_t(i)];
    const int64_t begin = spec.offset, end = begin + spec.shape.numel();
    moments.add(spec.name + ".exp_avg", optimizer.m().slice_rows(begin, end).view(spec.shape));
    moments.add(spec.name + ".exp_avg_sq", optimizer.v().slice_rows(begin, end).view(spec.shape));
  }
  moments.write(tmp / "optimizer.safetensors");

  nlohmann::json state = {
      {"format_version", kCheckpointFormatVersion},         {"step", step},
      {"model", model_config_to_json(model.config())},      {"tokenizer", config.tokenizer},
      {"compute_dtype", dtype_name(model.compute_dtype())}, {"seed", config.seed}};
  write_text(tmp / "state.json", state.dump(2));

  // Replace the previous checkpoint only once the new one is complete.
  const fs::path old = dir.string() + ".old";
  fs::remove_all(old);
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(tmp, dir);
  fs::remove_all(old);
}

CheckpointInfo read_checkpoint_info(const fs::path& dir) {
  nlohmann::json state = read_json(dir / "state.json");
  try {
    int version = state.at("format_version").get<int>();
    if (version != kCheckpointFormatVersion) {
      LATTICE_THROW(IoError, "'{}' has format version {}, this build reads version {}",
                    (dir / "state.json").string(), version, kCheckpointFormatVersion);
    }
    CheckpointInfo info;
    info.model = model_config_from_json(state.at("model"));
    info.tokenizer = state.at("tokenizer").get<std::string>();
    info.compute_dtype = parse_dtype(state.at("compute_dtype").get<std::string>());
    info.step = state.at("step").get<int64_t>();
    info.seed = state.at("seed").get<uint64_t>();
    return info;
  } catch (const nlohmann::json::exception& e) {
    LATTICE_THROW(IoError, "'{}' is missing a field: {}", (dir / "state.json").string(), e.what());
  }
}

std::unique_ptr<Transformer> load_checkpoint_model(const fs::path& dir, Arena& arena,
                                                   CheckpointInfo* info_out) {
  CheckpointInfo info = read_checkpoint_info(dir);
  auto model = std::make_unique<Transformer>(info.model, arena, info.compute_dtype);
  SafetensorsReader reader(dir / "model.safetensors");
  ParameterStore& store = model->parameters();
  const auto& specs = model->registry().specs();
  for (int i = 0; i < int(specs.size()); ++i) reader.read(specs[size_t(i)].name, store.master(i));
  store.refresh_compute_copy();
  if (info_out != nullptr) *info_out = info;
  return model;
}

int64_t load_checkpoint_optimizer(const fs::path& dir, AdamW& optimizer) {
  CheckpointInfo info = read_checkpoint_info(dir);
  SafetensorsReader reader(dir / "optimizer.safetensors");
  const auto& specs = optimizer.store().registry().specs();
  for (const ParameterSpec& spec : specs) {
    const int64_t begin = spec.offset, end = begin + spec.shape.numel();
    reader.read(spec.name + ".exp_avg", optimizer.m().slice_rows(begin, end).view(spec.shape));
    reader.read(spec.name + ".exp_avg_sq", optimizer.v().slice_rows(begin, end).view(spec.shape));
  }
  optimizer.set_steps_taken(info.step);
  return info.step;
}

}  // namespace lattice
