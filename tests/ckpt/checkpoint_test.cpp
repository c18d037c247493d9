// Checkpoints and Hugging Face weights: round trips that preserve the model exactly, and clear
// errors for weights that do not match.
#include "ckpt/checkpoint.h"
#include "ckpt/hf_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/model_config_json.h"
#include "ckpt/safetensors.h"
#include "core/philox.h"
#include "support/scratch_dir.h"
#include "train/pipeline_stage.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  return testing::scratch_dir("checkpoint_" + name);
}

std::vector<float> logits_of(Transformer& model) {
  std::vector<int32_t> tokens(2 * 10);
  PhiloxStream rng(9, 9);
  for (auto& t : tokens) t = int32_t(rng.next_below(uint64_t(model.config().vocab_size)));
  model.forward(Tensor::borrow(tokens.data(), {2, 10}, DType::kI32), Tensor());
  const Tensor& l = model.logits();
  return std::vector<float>(l.data<float>(), l.data<float>() + l.numel());
}

// `lattice export` of a model larger than the shard limit: the hub's sharded layout
// (model-0000k-of-0000n.safetensors + model.safetensors.index.json, as save_pretrained writes
// it), which --init-from reads back exactly; a later whole export replaces the shards.
std::vector<std::string> weight_files(const fs::path& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(HfExport, ALargeModelIsShardedTheHubsWayAndLoadsBackExactly) {
  const fs::path dir = scratch("hf_export_shards");
  Arena arena("test");
  const ModelConfig config = model_preset("gpt2-tiny");
  Transformer original(config, arena, DType::kF32);
  original.initialize(3);
  constexpr uint64_t kLimit = 100'000;  // gpt2-tiny's ~0.5 MB of f32 weights: several files
  export_hf(dir, original, {.max_shard_bytes = kLimit});

  std::ifstream in(dir / "model.safetensors.index.json");
  ASSERT_TRUE(in) << "no index";
  const nlohmann::json index = nlohmann::json::parse(in);
  const std::vector<std::string> files = weight_files(dir);
  ASSERT_GE(files.size(), 3u);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  const std::string n = fmt::format("{:05d}", files.size());
  uint64_t total = 0;
  size_t tensors = 0;
  std::set<std::string> mapped;
  for (size_t k = 0; k < files.size(); ++k) {
    EXPECT_EQ(files[k], fmt::format("model-{:05d}-of-{}.safetensors", k + 1, n));
    SafetensorsReader shard(dir / files[k]);
    uint64_t bytes = 0;
    for (const SafetensorsTensorInfo& t : shard.tensors()) {
      EXPECT_EQ(index["weight_map"][t.name], files[k]) << t.name;
      mapped.insert(t.name);
      bytes += uint64_t(t.shape.numel()) * 4;
      ++tensors;
    }
    // Within the limit, unless one tensor alone exceeds it.
    EXPECT_TRUE(bytes <= kLimit || shard.tensors().size() == 1) << files[k] << ": " << bytes;
    total += bytes;
  }
  EXPECT_EQ(index["weight_map"].size(), tensors);
  EXPECT_EQ(mapped.size(), tensors);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);

  Transformer loaded(config, arena, DType::kF32);
  loaded.initialize(4);
  load_hf_weights(dir, loaded);
  EXPECT_EQ(logits_of(original), logits_of(loaded));

  // A whole export into the same directory leaves no shard or index behind to shadow it.
  export_hf(dir, loaded);
  EXPECT_EQ(weight_files(dir), std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  Transformer again(config, arena, DType::kF32);
  again.initialize(5);
  load_hf_weights(dir, again);
  EXPECT_EQ(logits_of(original), logits_of(again));
}

// `--init-from DIR` as users pass it: a Hugging Face directory, whole or sharded the hub's
// way (model.safetensors.index.json), its config.json checked against the model's.
TEST(HfDirectory, LoadsAWholeOrShardedDirectoryAndRefusesAnotherArchitecture) {
  const fs::path dir = scratch("hf_dir");
  Arena arena("test");
  ModelConfig config = model_preset("gpt2-tiny");
  Transformer original(config, arena, DType::kF32);
  original.initialize(3);
  export_hf(dir, original);
  {
    Transformer loaded(config, arena, DType::kF32);
    loaded.initialize(4);
    load_hf_weights(dir, loaded);
    EXPECT_EQ(logits_of(original), logits_of(loaded));
  }
  // The same tensors in two files with an index.
  const fs::path sharded = scratch("hf_dir_sharded");
  fs::copy_file(dir / "config.json", sharded / "config.json");
  SafetensorsReader whole(dir / "model.safetensors");
  std::vector<Tensor> values;
  SafetensorsWriter first, second;
  nlohmann::json map = nlohmann::json::object();
  int n = 0;
  for (const SafetensorsTensorInfo& t : whole.tensors())
    values.push_back(Tensor::empty(arena, t.shape, DType::kF32));
  for (const SafetensorsTensorInfo& t : whole.tensors()) {
    Tensor& v = values[size_t(n)];
    whole.read(t.name, v, DTypePolicy::kConvert);
    const bool in_first = n++ % 2 == 0;
    (in_first ? first : second).add(t.name, v);
    map[t.name] =
        in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  first.write(sharded / "model-00001-of-00002.safetensors");
  second.write(sharded / "model-00002-of-00002.safetensors");
  std::ofstream(sharded / "model.safetensors.index.json")
      << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", map}}.dump();
  {
    Transformer loaded(config, arena, DType::kF32);
    loaded.initialize(5);
    load_hf_weights(sharded, loaded);
    EXPECT_EQ(logits_of(original), logits_of(loaded));
  }
  // A config.json of another architecture is named before any tensor is read.
  nlohmann::json other = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  other["n_layer"] = 3;
  std::ofstream(dir / "config.json") << other.dump();
  Transformer loaded(config, arena, DType::kF32);
  try {
    load_hf_weights(dir, loaded);
    ADD_FAILURE() << "a 3-layer config.json loaded into a 2-layer model";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n_layer is 3 there, 2 here"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(load_hf_weights(scratch("hf_dir_empty"), loaded), IoError);
}

// Every field of a ModelConfig but its name (which config.json does not carry).
nlohmann::json fields_of(const ModelConfig& config) {
  nlohmann::json j = model_config_to_json(config);
  j.erase("name");
  return j;
}

class HfRoundTrip : public ::testing::TestWithParam<const char*> {};

// export -> load into a fresh model -> identical logits, bit for bit.
TEST_P(HfRoundTrip, ExportThenLoadGivesIdenticalLogits) {
  fs::path dir = scratch(std::string("hf_") + GetParam());
  Arena arena("test");
  ModelConfig config = model_preset(GetParam());
  if (config.name == "shakespeare-char")
    config.bias = false;  // the demo: exported with zero biases
  Transformer original(config, arena, DType::kF32);
  original.initialize(3);
  export_hf(dir, original);

  nlohmann::json hf = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  const std::string param = GetParam();
  EXPECT_EQ(hf["model_type"], param.starts_with("llama")     ? "llama"
                              : param.starts_with("mixtral") ? "mixtral"
                                                             : "gpt2");
  if (hf["model_type"] == "gpt2") {
    // A 256-token vocabulary has no id 50256 (GPT2Config's default): none is written.
    EXPECT_TRUE(hf.contains("bos_token_id") && hf["bos_token_id"].is_null()) << hf.dump();
    EXPECT_TRUE(hf.contains("eos_token_id") && hf["eos_token_id"].is_null()) << hf.dump();
  }

  Transformer loaded(config, arena, DType::kF32);
  loaded.initialize(4);  // different values, overwritten by the load
  load_hf_weights(dir / "model.safetensors", loaded);
  std::vector<float> a = logits_of(original), b = logits_of(loaded);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);

  // config.json reads back as the same architecture (Hugging Face's GPT-2 always has biases:
  // a bias-free model's are the zeros written).
  ModelConfig expected = config;
  if (expected.family == ModelFamily::kGpt2) expected.bias = true;
  EXPECT_EQ(fields_of(read_hf_model_config(dir)), fields_of(expected));
}

INSTANTIATE_TEST_SUITE_P(Families, HfRoundTrip,
                         ::testing::Values("gpt2-tiny", "llama-tiny", "mixtral-tiny",
                                           "shakespeare-char"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

// A mixture-of-experts model exports as transformers' MixtralForCausalLM: its config.json
// reads back as the same ModelConfig (the Lattice-only router settings under lattice_ keys), and
// every tensor, the router and each expert's w1/w2/w3 under block_sparse_moe, comes back bit for
// bit.
TEST(HfMixtral, ExportThenImportIsExactForTheConfigAndEveryTensor) {
  const fs::path dir = scratch("hf_mixtral");
  Arena arena("test");
  ModelConfig config = model_preset("mixtral-tiny");
  config.capacity_factor = 1.5f;  // Lattice-only: travels under lattice_capacity_factor
  Transformer original(config, arena, DType::kF32);
  original.initialize(3);
  export_hf(dir, original);

  const nlohmann::json hf = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  EXPECT_EQ(hf.at("architectures"), nlohmann::json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(hf.at("model_type"), "mixtral");
  EXPECT_EQ(hf.at("num_local_experts"), 4);
  EXPECT_EQ(hf.at("num_experts_per_tok"), 2);
  EXPECT_EQ(hf.at("router_aux_loss_coef").get<float>(), 0.01f);
  EXPECT_EQ(hf.at("output_router_logits"), false);
  EXPECT_TRUE(hf.at("sliding_window").is_null());
  EXPECT_EQ(hf.at("intermediate_size"), 96);  // per expert
  EXPECT_EQ(hf.at("hidden_size"), 64);
  EXPECT_EQ(hf.at("num_hidden_layers"), 2);
  EXPECT_EQ(hf.at("num_attention_heads"), 4);
  EXPECT_EQ(hf.at("num_key_value_heads"), 2);
  EXPECT_EQ(hf.at("max_position_embeddings"), 64);
  EXPECT_EQ(hf.at("vocab_size"), 256);
  EXPECT_EQ(hf.at("tie_word_embeddings"), false);
  EXPECT_EQ(hf.at("rms_norm_eps").get<float>(), config.norm_eps);
  EXPECT_EQ(hf.at("rope_theta").get<float>(), config.rope_theta);
  EXPECT_EQ(hf.at("lattice_router_z_loss_coef").get<float>(), 0.001f);
  EXPECT_EQ(hf.at("lattice_capacity_factor").get<float>(), 1.5f);
  const ModelConfig read = read_hf_model_config(dir);
  EXPECT_EQ(read.n_experts, 4);
  EXPECT_EQ(fields_of(read), fields_of(config));

  // The file holds exactly the registry's tensors, under Mixtral's names, with their values.
  SafetensorsReader file(dir / "model.safetensors");
  const ParameterRegistry& registry = original.registry();
  EXPECT_EQ(file.tensors().size(), registry.specs().size());
  int64_t expert_tensors = 0;
  for (const SafetensorsTensorInfo& t : file.tensors()) {
    EXPECT_EQ(t.name.find(".mlp."), std::string::npos) << t.name;
    if (t.name.find(".block_sparse_moe.experts.") != std::string::npos) ++expert_tensors;
  }
  EXPECT_EQ(expert_tensors, config.n_layer * config.n_experts * 3);
  for (int64_t l = 0; l < config.n_layer; ++l) {
    const std::string moe = fmt::format("model.layers.{}.block_sparse_moe.", l);
    ASSERT_TRUE(file.contains(moe + "gate.weight")) << moe;
    EXPECT_EQ(file.info(moe + "gate.weight").shape, (Shape{4, 64}));
    for (int64_t e = 0; e < config.n_experts; ++e) {
      const std::string expert = fmt::format("{}experts.{}.", moe, e);
      ASSERT_TRUE(file.contains(expert + "w1.weight")) << expert;
      EXPECT_EQ(file.info(expert + "w1.weight").shape, (Shape{96, 64}));
      EXPECT_EQ(file.info(expert + "w2.weight").shape, (Shape{64, 96}));
      EXPECT_EQ(file.info(expert + "w3.weight").shape, (Shape{96, 64}));
    }
  }

  Transformer loaded(config, arena, DType::kF32);
  loaded.initialize(4);  // different values, overwritten by the load
  load_hf_weights(dir, loaded);
  for (int i = 0; i < int(registry.specs().size()); ++i) {
    const ParameterSpec& spec = registry.at(i);
    const Tensor& want = original.parameters().master(i);
    const std::span<const std::byte> stored = file.bytes(spec.name);
    ASSERT_EQ(stored.size(), want.nbytes()) << spec.name;
    EXPECT_EQ(std::memcmp(stored.data(), want.raw_data(), want.nbytes()), 0) << spec.name;
    EXPECT_EQ(std::memcmp(loaded.parameters().master(i).raw_data(), want.raw_data(), want.nbytes()),
              0)
        << spec.name;
  }
  std::vector<float> a = logits_of(original), b = logits_of(loaded);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// A Lattice checkpoint of a mixture-of-experts model keeps its experts: the manifest's model
// config carries them (a dense model's JSON is as before, without the expert keys).
TEST(HfMixtral, CheckpointManifestsCarryTheExperts) {
  ModelConfig config = model_preset("mixtral-tiny");
  config.capacity_factor = 1.25f;
  const nlohmann::json j = model_config_to_json(config);
  EXPECT_EQ(j.at("n_experts"), 4);
  const ModelConfig back = model_config_from_json(j);
  EXPECT_EQ(back.n_experts, 4);
  EXPECT_EQ(model_config_to_json(back), j);
  EXPECT_FALSE(model_config_to_json(model_preset("llama-tiny")).contains("n_experts"));
  EXPECT_EQ(model_config_from_json(model_config_to_json(model_preset("llama-tiny"))).n_experts, 0);

  const fs::path dir = scratch("ckpt_mixtral") / "final";
  Arena arena("test");
  TrainConfig train;
  train.model = config;
  Transformer model(config, arena, DType::kF32);
  model.initialize(2);
  AdamW optimizer(model.parameters(), arena, train.adam);
  TrainingState state;
  state.seed = train.seed;
  save_training_checkpoint(CheckpointTarget::directory(dir), train, model, optimizer, state);
  CheckpointInfo info;
  std::unique_ptr<Transformer> loaded = load_checkpoint_model(dir, arena, &info);
  EXPECT_EQ(fields_of(info.model), fields_of(config));
  EXPECT_EQ(logits_of(*loaded), logits_of(model));
}

std::string config_error_of(const nlohmann::json& hf) {
  try {
    model_config_from_hf(hf, "config.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// What Lattice's blocks cannot compute is named with its key and the fix, both when reading a
// config.json and when loading a directory's weights; a Mixtral of another shape is refused.
TEST(HfMixtral, FeaturesLatticeLacksAreClearConfigErrors) {
  const fs::path dir = scratch("hf_mixtral_refuse");
  Arena arena("test");
  const ModelConfig config = model_preset("mixtral-tiny");
  Transformer original(config, arena, DType::kF32);
  original.initialize(3);
  export_hf(dir, original);
  const nlohmann::json exported = nlohmann::json::parse(std::ifstream(dir / "config.json"));

  auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json j = exported;
    j[key] = value;
    return j;
  };
  // A window covering the whole context is the same attention.
  EXPECT_EQ(model_config_from_hf(with("sliding_window", 64), "config.json").n_experts, 4);
  // A field of the wrong type names its key and both types.
  const std::string typed = config_error_of(with("num_local_experts", "4"));
  EXPECT_NE(typed.find("config.json: 'num_local_experts' is a string (\"4\"), expected an integer"),
            std::string::npos)
      << typed;
  EXPECT_NE(config_error_of(with("mlp_bias", "no")).find("'mlp_bias' is a string"),
            std::string::npos);
  std::string what = config_error_of(with("sliding_window", 16));
  EXPECT_NE(what.find("\"sliding_window\": 16"), std::string::npos) << what;
  EXPECT_NE(what.find("---> HINT: set model.seq_len (and batch.seq_len) to at most 16"),
            std::string::npos)
      << what;
  for (const auto& [key, value] : std::vector<std::pair<const char*, nlohmann::json>>{
           {"attention_bias", true},
           {"router_jitter_noise", 0.01},
           {"hidden_act", "gelu"},
           {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}},
           {"head_dim", 32}}) {
    what = config_error_of(with(key, value));
    EXPECT_NE(what.find(fmt::format("\"{}\"", key)), std::string::npos) << key << ": " << what;
    EXPECT_NE(what.find("---> HINT:"), std::string::npos) << key << ": " << what;
  }
  what = config_error_of(with("model_type", "mistral"));
  EXPECT_NE(what.find("\"mistral\" is not one Lattice reads"), std::string::npos) << what;
  what = config_error_of(with("num_experts_per_tok", 5));
  EXPECT_NE(what.find("experts_per_token = 5"), std::string::npos) << what;

  // Through --init-from's load: the directory's config.json is checked before any tensor.
  std::ofstream(dir / "config.json") << with("sliding_window", 16).dump();
  Transformer model(config, arena, DType::kF32);
  try {
    load_hf_weights(dir, model);
    ADD_FAILURE() << "a 16-token sliding window loaded into a 64-token model";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "config.json") << with("num_local_experts", 8).dump();
  try {
    load_hf_weights(dir, model);
    ADD_FAILURE() << "an 8-expert config.json loaded into a 4-expert model";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("num_local_experts is 8 there, 4 here"), std::string::npos)
        << e.what();
  }
  // A dense Llama is not a Mixtral.
  std::ofstream(dir / "config.json") << exported.dump();
  Transformer dense(model_preset("llama-tiny"), arena, DType::kF32);
  try {
    load_hf_weights(dir, dense);
    ADD_FAILURE() << "a Mixtral directory loaded into a dense Llama";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model_type is \"mixtral\" there, \"llama\" here"),
              std::string::npos)
        << e.what();
  }
  // Hugging Face's Mixtral has no biases to export them into.
  ModelConfig biased = config;
  biased.bias = true;
  EXPECT_THROW(hf_config_json(biased), ValueError);
}

// Hugging Face's GPT-2 files name tensors without "transformer.", carry attention-mask buffers
// and store weights in F16/BF16 at times: all of that loads, widened exactly.
TEST(HfImport, AcceptsGpt2HubNamingMaskBuffersAndHalfPrecision) {
  fs::path dir = scratch("hub");
  Arena arena("test");
  Transformer source(model_preset("gpt2-tiny"), arena, DType::kF32);
  source.initialize(5);
  // Round the source to bf16 so the widened load is exactly comparable.
  ParameterStore& s = source.parameters();
  Tensor rounded = Tensor::empty(arena, s.master().shape(), DType::kBF16);
  rounded.copy_from(s.master());
  s.master().copy_from(rounded);

  SafetensorsWriter writer;
  std::vector<Tensor> keep;
  for (int i = 0; i < int(source.registry().specs().size()); ++i) {
    const ParameterSpec& spec = source.registry().at(i);
    Tensor half = Tensor::empty(arena, spec.shape, DType::kBF16);
    half.copy_from(s.master(i));
    keep.push_back(half);
    writer.add(spec.name.substr(std::string("transformer.").size()), half);
  }
  Tensor mask = Tensor::zeros(arena, {1, 1, 4, 4}, DType::kF32);
  writer.add("h.0.attn.bias", mask);
  writer.write(dir / "model.safetensors");

  Transformer loaded(model_preset("gpt2-tiny"), arena, DType::kF32);
  load_hf_weights(dir / "model.safetensors", loaded);
  EXPECT_EQ(std::memcmp(loaded.parameters().master().raw_data(), s.master().raw_data(),
                        s.master().nbytes()),
            0);
}

// Each pipeline stage reads the tensors of its part (the last stage's tied copy reads the token
// table): the stages together hold exactly the values of the whole model.
TEST(HfImport, PipelineStagesReadTheirParts) {
  fs::path dir = scratch("hf_stages");
  Arena arena("test");
  ModelConfig config = model_preset("gpt2-tiny");
  config.n_layer = 4;
  Transformer original(config, arena, DType::kF32);
  original.initialize(3);
  export_hf(dir, original);
  const StagePartition partition = partition_model(config, 2, 1);
  int64_t tensors = 0;
  for (int stage = 0; stage < 2; ++stage) {
    Transformer part(config, arena, DType::kF32, TensorParallel(), stage_part(partition, 2, stage));
    part.initialize(4);  // different values, overwritten by the load
    load_hf_weights(dir / "model.safetensors", part);
    for (int i = 0; i < int(part.registry().specs().size()); ++i) {
      const ParameterSpec& spec = part.registry().at(i);
      const int whole = original.registry().find(spec.name);
      ASSERT_GE(whole, 0) << spec.name;
      EXPECT_EQ(std::memcmp(part.parameters().master(i).raw_data(),
                            original.parameters().master(whole).raw_data(),
                            size_t(spec.local_shape.numel()) * sizeof(float)),
                0)
          << "stage " << stage << " " << spec.name;
      tensors += spec.tied_copy ? 0 : 1;
    }
  }
  EXPECT_EQ(tensors, int64_t(original.registry().specs().size()));
}

TEST(HfImport, MismatchedWeightsAreAClearErrorListingExpectedAndFound) {
  fs::path dir = scratch("mismatch");
  Arena arena("test");
  ModelConfig wide = model_preset("gpt2-tiny");
  wide.d_model = 128;
  wide.d_ff = 512;
  Transformer other(wide, arena, DType::kF32);
  other.initialize(1);
  export_hf(dir, other);
  Transformer model(model_preset("gpt2-tiny"), arena, DType::kF32);
  try {
    load_hf_weights(dir / "model.safetensors", model);
    FAIL();
  } catch (const IoError& e) {
    std::string what = e.what();
    // The first tensor in name order that differs, with both shapes.
    EXPECT_NE(what.find("'transformer.h.0.attn.c_attn.bias' has shape [384]"), std::string::npos)
        << what;
    EXPECT_NE(what.find("expects [192]"), std::string::npos) << what;
  }
  Transformer llama(model_preset("llama-tiny"), arena, DType::kF32);
  try {
    load_hf_weights(dir / "model.safetensors", llama);
    FAIL();
  } catch (const IoError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("missing [model.embed_tokens.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("unexpected [transformer."), std::string::npos) << what;
  }
}

TEST(HfExport, RefusesSwitchesTheFamilyCannotExpress) {
  Arena arena("test");
  ModelConfig c = model_preset("gpt2-tiny");
  c.norm = NormKind::kRmsNorm;
  Transformer model(c, arena, DType::kF32);
  EXPECT_THROW(export_hf(scratch("refuse"), model), ValueError);
  // Real (non-zero) biases cannot be dropped into a bias-free model.
  ModelConfig with_bias = model_preset("gpt2-tiny");
  Transformer biased(with_bias, arena, DType::kF32);
  biased.initialize(1);
  biased.parameters()
      .master(biased.registry().find("transformer.h.1.mlp.c_fc.bias"))
      .data<float>()[3] = 0.5f;
  fs::path dir = scratch("nonzero_bias");
  export_hf(dir, biased);
  ModelConfig no_bias = with_bias;
  no_bias.bias = false;
  Transformer plain(no_bias, arena, DType::kF32);
  try {
    load_hf_weights(dir / "model.safetensors", plain);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("set model.bias = true"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, SaveThenLoadRestoresWeightsMomentsAndStep) {
  fs::path dir = scratch("ckpt") / "final";
  Arena arena("test");
  TrainConfig config;
  config.model = model_preset("llama-tiny");
  Transformer model(config.model, arena, DType::kBF16);
  model.initialize(2);
  AdamW optimizer(model.parameters(), arena, config.adam);
  fill_normal(model.parameters().grads().data<float>(), model.parameters().grads().numel(), 1, 2, 0,
              0.0f, 0.1f);
  optimizer.step(1e-3f);
  optimizer.step(1e-3f);
  TrainingState state;
  state.step = 2;
  state.lr_step = 2;
  state.seed = config.seed;
  const CheckpointTarget target = CheckpointTarget::directory(dir);
  EXPECT_EQ(save_training_checkpoint(target, config, model, optimizer, state), dir);
  // Overwriting keeps one valid checkpoint, and a fixed directory gets no `latest` beside it.
  save_training_checkpoint(target, config, model, optimizer, state);
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
  EXPECT_FALSE(fs::exists(dir.parent_path() / "latest"));

  CheckpointInfo info;
  std::unique_ptr<Transformer> loaded = load_checkpoint_model(dir, arena, &info);
  EXPECT_EQ(info.step, 2);
  EXPECT_EQ(info.compute_dtype, DType::kBF16);
  EXPECT_EQ(info.model.n_kv_head, 2);
  EXPECT_EQ(
      std::memcmp(loaded->parameters().master().raw_data(), model.parameters().master().raw_data(),
                  model.parameters().master().nbytes()),
      0);
  EXPECT_EQ(logits_of(*loaded), logits_of(model));
  AdamW restored(loaded->parameters(), arena, config.adam);
  EXPECT_EQ(load_training_checkpoint(dir, *loaded, restored), state);
  EXPECT_EQ(std::memcmp(restored.v().raw_data(), optimizer.v().raw_data(), optimizer.v().nbytes()),
            0);
}

TEST(Checkpoint, MissingOrCorruptStateIsAClearError) {
  fs::path dir = scratch("broken");
  EXPECT_THROW(read_checkpoint_info(dir), IoError);
  std::ofstream(dir / "state.json") << "{ not json";
  try {
    read_checkpoint_info(dir);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("state.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace lattice
