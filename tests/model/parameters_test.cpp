#include "model/parameters.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/dtype.h"

namespace lattice {
namespace {

int64_t parameter_count(const ParameterRegistry& r) {
  int64_t n = 0;
  for (const ParameterSpec& s : r.specs()) n += s.shape.numel();
  return n;
}

TEST(ParameterRegistry, Gpt2SmallHasThePublishedCountAndHuggingFaceNames) {
  ParameterRegistry r(model_preset("gpt2-124m"));
  EXPECT_EQ(parameter_count(r), 124439808);  // GPT-2 small with tied embeddings
  const int attn = r.find("transformer.h.0.attn.c_attn.weight");
  ASSERT_GE(attn, 0);
  EXPECT_EQ(r.at(attn).shape, (Shape{768, 2304}));  // Conv1D: [in, out]
  EXPECT_GE(r.find("transformer.wte.weight"), 0);
  EXPECT_GE(r.find("transformer.wpe.weight"), 0);
  EXPECT_GE(r.find("transformer.h.11.mlp.c_proj.bias"), 0);
  EXPECT_GE(r.find("transformer.ln_f.bias"), 0);
  EXPECT_EQ(r.find("lm_head.weight"), -1);  // tied to wte
}

TEST(ParameterRegistry, SmolLm135mHasHuggingFacesCountWithTiedEmbeddings) {
  ParameterRegistry r(model_preset("smollm-135m"));
  EXPECT_EQ(parameter_count(r), 134515008);  // HuggingFaceTB/SmolLM-135M's safetensors
  EXPECT_EQ(r.find("lm_head.weight"), -1);
  const int k = r.find("model.layers.29.self_attn.k_proj.weight");
  ASSERT_GE(k, 0);
  EXPECT_EQ(r.at(k).shape, (Shape{192, 576}));  // 3 kv heads × 64
}

TEST(ParameterRegistry, LlamaNamesAndGroupedQueryShapes) {
  ParameterRegistry r(model_preset("llama-tiny"));
  const int k = r.find("model.layers.1.self_attn.k_proj.weight");
  ASSERT_GE(k, 0);
  EXPECT_EQ(r.at(k).shape, (Shape{32, 64}));  // [out = 2 kv heads × 16, in]
  EXPECT_GE(r.find("model.layers.0.mlp.gate_proj.weight"), 0);
  EXPECT_GE(r.find("model.norm.weight"), 0);
  EXPECT_GE(r.find("lm_head.weight"), 0);
  EXPECT_EQ(r.find("model.layers.0.self_attn.q_proj.bias"), -1);
  EXPECT_FALSE(r.at(r.find("model.norm.weight")).weight_decay);
  EXPECT_TRUE(r.at(k).weight_decay);
}

TEST(ParameterRegistry, ParametersStartAligned) {
  ParameterRegistry r(model_preset("llama-tiny"));
  for (const ParameterSpec& s : r.specs()) EXPECT_EQ(s.offset % 16, 0) << s.name;
}

// Any shard initialises alone to the matching slice of the whole tensor, bit for bit.
TEST(InitialValues, ShardEqualsSliceOfWhole) {
  ModelConfig config = model_preset("gpt2-tiny");
  ParameterRegistry r(config);
  for (const ParameterSpec& spec : r.specs()) {
    const int64_t n = spec.shape.numel();
    std::vector<float> whole(static_cast<size_t>(n));
    initial_values(spec, config, 99, 0, n, whole.data());
    const int64_t first = n / 3, count = n - first - n / 5;
    std::vector<float> shard(static_cast<size_t>(count));
    initial_values(spec, config, 99, first, count, shard.data());
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(float_bits(shard[size_t(i)]), float_bits(whole[size_t(first + i)])) << spec.name;
    }
  }
}

TEST(InitialValues, ResidualProjectionsAreScaledDown) {
  ModelConfig config = model_preset("gpt2-124m");
  ParameterRegistry r(config);
  auto stddev = [&](const char* name) {
    const ParameterSpec& spec = r.at(r.find(name));
    const int64_t n = 200000;
    std::vector<float> v(static_cast<size_t>(n));
    initial_values(spec, config, 1, 0, n, v.data());
    double ss = 0;
    for (float x : v) ss += double(x) * x;
    return std::sqrt(ss / double(n));
  };
  EXPECT_NEAR(stddev("transformer.h.0.attn.c_attn.weight"), 0.02, 0.0005);
  EXPECT_NEAR(stddev("transformer.h.0.attn.c_proj.weight"), 0.02 / std::sqrt(24.0), 0.0002);
}

TEST(ModelConfig, RejectsInconsistentSwitchesWithTheFix) {
  ModelConfig c = model_preset("llama-tiny");
  c.n_kv_head = 3;
  EXPECT_THROW(c.validate(), ConfigError);
  c = model_preset("gpt2-tiny");
  c.d_model = 66;
  try {
    c.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n_head"), std::string::npos);
  }
  EXPECT_THROW(model_preset("gpt3"), ConfigError);
}

}  // namespace
}  // namespace lattice
