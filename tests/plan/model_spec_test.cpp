#include "plan/model_spec.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "plan/model_file.h"
#include "plan/model_presets.h"

namespace lattice::plan {
namespace {

int64_t published_count(const char* preset) {
  return count_parameters(model_preset(preset), /*use_padded_vocab=*/false).total;
}

// Hugging Face's parameter counts of the released checkpoints (tied embeddings counted once).
TEST(ModelPresets, Gpt2CountsMatchTheReleasedCheckpoints) {
  EXPECT_EQ(published_count("gpt2-124m"), 124'439'808);
  EXPECT_EQ(published_count("gpt2-350m"), 354'823'168);
  EXPECT_EQ(published_count("gpt2-774m"), 774'030'080);
  EXPECT_EQ(published_count("gpt2-1.5b"), 1'557'611'200);
}

TEST(ModelPresets, Llama3CountsMatchTheModelCards) {
  EXPECT_EQ(published_count("llama-3-8b"), 8'030'261'248);
  EXPECT_EQ(published_count("llama-3-70b"), 70'553'706'496);
  EXPECT_EQ(published_count("llama-3-405b"), 405'853'388'800);
}

TEST(ModelPresets, SmolLmCountMatchesTheReleasedCheckpoint) {
  EXPECT_EQ(published_count("smollm-135m"), 134'515'008);  // tied embeddings counted once
}

TEST(ModelPresets, Gpt3MatchesTheClosedFormAndThePaper) {
  const ModelSpec m = model_preset("gpt3-175b");
  const double l = 96, h = 12288, V = 50257, s = 2048;
  // Ψ = 12lh²(1 + 13/(12h) + (V+s)/(12lh)) leaves out only the final LayerNorm (2h).
  const double closed_form = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
  EXPECT_DOUBLE_EQ(double(count_parameters(m, false).total), closed_form + 2 * h);
  EXPECT_NEAR(double(count_parameters(m, false).total) / 175e9, 1.0, 0.005);  // Brown et al.
}

TEST(ModelPresets, PaddedVocabularyAddsTheStoredRows) {
  const ModelSpec m = model_preset("gpt2-124m");
  EXPECT_EQ(count_parameters(m).total - count_parameters(m, false).total, (50304 - 50257) * 768);
}

TEST(ModelPresets, RepositoryTinyPresetsCountedByHand) {
  // gpt2-tiny: h 64, 2 layers, V 256, s 64. Embeddings 256·64 + 64·64 = 20480; a layer
  // 12h² + 13h = 49152 + 832 = 49984; final LayerNorm 128.
  EXPECT_EQ(published_count("gpt2-tiny"), 20480 + 2 * 49984 + 128);
  // llama-tiny: h 64, 2 kv heads of 16 (kv 32), ffn 176, untied. Per layer: QKV 64·128 + out
  // 64·64 = 12288, SwiGLU 3·64·176 = 33792, two RMSNorms 128; embedding and output 2·256·64.
  EXPECT_EQ(published_count("llama-tiny"), 2 * (12288 + 33792 + 128) + 2 * 256 * 64 + 64);
  // shakespeare-char: h 128, 4 layers, V 256, s 64.
  EXPECT_EQ(published_count("shakespeare-char"),
            256 * 128 + 64 * 128 + 4 * (12 * 128 * 128 + 13 * 128) + 2 * 128);
}

// Mixtral 8x7B as Hugging Face counts the released checkpoint (46,702,792,704), and the share a
// token uses: 2 of the 8 experts (Jiang et al. 2024: "13B active parameters").
TEST(ModelPresets, MixtralCountsMatchTheReleasedCheckpointAndItsActiveShare) {
  const ParameterCounts c = count_parameters(model_preset("mixtral-8x7b"), false);
  EXPECT_EQ(c.total, 46'702'792'704);
  EXPECT_EQ(c.active, 12'879'925'248);
  EXPECT_EQ(c.per_layer_router, 4096 * 8);
  EXPECT_EQ(c.per_layer_experts, 8 * 3 * 4096 * 14336);
  // mixtral-tiny, the trainer's preset: per layer attention 12288, router 64·4, four SwiGLU
  // experts of 96 (4·3·64·96), two RMSNorms; untied embeddings.
  const ParameterCounts tiny = count_parameters(model_preset("mixtral-tiny"), false);
  EXPECT_EQ(tiny.total, 2 * (12288 + 256 + 73728 + 128) + 2 * 256 * 64 + 64);
  EXPECT_EQ(tiny.active, 2 * (12288 + 256 + 36864 + 128) + 2 * 256 * 64 + 64);
  // A dense model: everything is active.
  const ParameterCounts dense = count_parameters(model_preset("llama-3-8b"));
  EXPECT_EQ(dense.active, dense.total);
  EXPECT_EQ(dense.per_layer_experts, 0);
}

TEST(ModelPresets, UnknownNameListsThePresets) {
  try {
    model_preset("gpt5");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("llama-3-70b"), std::string::npos) << e.what();
  }
}

TEST(ModelFile, TomlOverridesAPreset) {
  ModelSpec m = parse_model_toml(
      "[model]\npreset = \"gpt2-124m\"\nname = \"wide\"\nd_model = 1024\nn_heads = 16\n"
      "n_kv_heads = 16\n",
      "x.toml");
  EXPECT_EQ(m.name, "wide");
  EXPECT_EQ(m.d_model, 1024);
  EXPECT_EQ(m.n_layers, 12);  // from the preset
  // Heads changed without kv heads: the preset's 12 kv heads do not divide 16 heads.
  EXPECT_THROW(parse_model_toml("preset = \"gpt2-124m\"\nn_heads = 16\nn_kv_heads = 5\n", "y"),
               ConfigError);
}

TEST(ModelFile, TomlFromScratchFillsDefaults) {
  ModelSpec m = parse_model_toml(
      "n_layers = 2\nn_heads = 4\nd_model = 64\nvocab_size = 256\nseq_len = 64\n"
      "norm = \"rmsnorm\"\nactivation = \"swiglu\"\n",
      "small.toml");
  EXPECT_EQ(m.name, "small");
  EXPECT_EQ(m.n_kv_heads, 4);
  EXPECT_EQ(m.d_ff, 256);
  EXPECT_EQ(m.padded_vocab_size, 256);
  EXPECT_EQ(m.norm, NormKind::kRmsNorm);
  EXPECT_EQ(m.mlp, MlpKind::kSwiglu);
}

// Found by model_file_fuzz: a float where an integer belongs, and a width whose derived d_ff
// (4 · d_model) overflowed, were undefined behaviour; both are named config errors.
TEST(ModelFile, AFloatOrAHugeDimensionIsAConfigError) {
  const std::string base = "n_layers = 2\nn_heads = 4\nvocab_size = 256\nseq_len = 64\n";
  EXPECT_THROW(parse_model_toml(base + "d_model = 64.0\n", "float.toml"), ConfigError);
  try {
    parse_model_toml(base + "d_model = 7685555555555555555\n", "huge.toml");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("d_model = 7685555555555555555 is larger than any "
                                         "model the planner can price (at most 1048576)"),
              std::string::npos)
        << e.what();
  }
}

TEST(ModelFile, BadValuesNameTheKey) {
  try {
    parse_model_toml(
        "n_layers = 2\nn_heads = 4\nd_model = 64\nvocab_size = 256\nseq_len = 64\n"
        "norm = \"batchnorm\"\n",
        "bad.toml");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("norm"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_model_toml("n_layers = \"two\"\n", "bad.toml"), ConfigError);
  EXPECT_THROW(parse_model_toml("n_layers = 2\n", "incomplete.toml"), ConfigError);
  EXPECT_THROW(parse_model_toml("n_layers = [", "broken.toml"), ConfigError);
  EXPECT_THROW(load_model_file("/nonexistent/model.toml"), IoError);
  try {
    parse_model_hf_json(R"({"model_type": 2, "num_hidden_layers": 2})", "config.json");
    ADD_FAILURE() << "a numeric model_type was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: 'model_type' is a number (2), expected a "
                                         "string"),
              std::string::npos)
        << e.what();
  }
  try {
    parse_model_hf_json(R"({"model_type": "llama", "num_hidden_layers": "2"})", "config.json");
    ADD_FAILURE() << "a string layer count was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'num_hidden_layers' is a string (\"2\"), expected an "
                                         "integer"),
              std::string::npos)
        << e.what();
  }
}

TEST(ModelFile, HuggingFaceLlamaConfigMatchesThePreset) {
  ModelSpec m = parse_model_hf_json(R"({"model_type": "llama", "num_hidden_layers": 32,
      "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
      "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
      "tie_word_embeddings": false})",
                                    "config.json");
  EXPECT_EQ(count_parameters(m).total, count_parameters(model_preset("llama-3-8b")).total);
}

TEST(ModelFile, HuggingFaceMixtralConfigAndTomlExpertsMatchThePreset) {
  ModelSpec m = parse_model_hf_json(R"({"model_type": "mixtral", "num_hidden_layers": 32,
      "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
      "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768,
      "num_local_experts": 8, "num_experts_per_tok": 2})",
                                    "config.json");
  EXPECT_EQ(m.n_experts, 8);
  EXPECT_EQ(m.experts_per_token, 2);
  EXPECT_EQ(count_parameters(m).total, count_parameters(model_preset("mixtral-8x7b")).total);
  const ModelSpec t = parse_model_toml(
      "preset = \"llama-tiny\"\nn_experts = 4\nexperts_per_token = 2\nd_ff = 96\n", "moe.toml");
  EXPECT_EQ(count_parameters(t).total, count_parameters(model_preset("mixtral-tiny")).total);
  EXPECT_THROW(parse_model_toml("preset = \"llama-tiny\"\nn_layers = 65536\nd_model = 1048576\n"
                                "n_heads = 1024\nn_kv_heads = 1024\nd_ff = 4194304\n"
                                "n_experts = 4096\nexperts_per_token = 2\n",
                                "huge.toml"),
               ConfigError);
  try {
    parse_model_toml("preset = \"llama-tiny\"\nn_experts = 4\nexperts_per_token = 5\n", "k.toml");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n_experts 4 with experts_per_token 5"), std::string::npos)
        << e.what();
  }
}

TEST(ModelFile, HuggingFaceGpt2ConfigMatchesThePreset) {
  ModelSpec m = parse_model_hf_json(R"({"model_type": "gpt2", "n_layer": 12, "n_embd": 768,
      "n_head": 12, "vocab_size": 50257, "n_positions": 1024})",
                                    "config.json");
  EXPECT_EQ(m.padded_vocab_size, 50304);
  EXPECT_EQ(count_parameters(m).total, count_parameters(model_preset("gpt2-124m")).total);
}

}  // namespace
}  // namespace lattice::plan
