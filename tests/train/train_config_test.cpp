#include "train/train_config.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace lattice {
namespace {

std::string error_of(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_train_config(toml, "test.toml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfig, ReadsEverySectionAndAppliesOverridesInOrder) {
  TrainConfig c =
      parse_train_config(R"(
[model]
preset = "llama-tiny"
n_layer = 3
[batch]
micro_batch = 4
micro_batches = 2
[optim]
lr = 3e-4
[train]
steps = 7
precision = "bf16"
)",
                         "test.toml", {"optim.lr=1e-3", "model.d_ff=64", "train.precision=fp32"});
  EXPECT_EQ(c.model.name, "llama-tiny");
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.d_ff, 64);
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_FLOAT_EQ(c.lr, 1e-3f);
  EXPECT_EQ(c.compute_dtype, DType::kF32);
  EXPECT_EQ(c.steps, 7);
  EXPECT_EQ(c.decay_steps, 7);
  EXPECT_EQ(c.seq_len, 64);
  c.resolve_batch();
  EXPECT_EQ(c.global_batch, 8);
}

TEST(TrainConfig, UnknownKeySuggestsTheNearestValidKey) {
  std::string e = error_of("[optim]\nlearning_rate = 1e-3\n");
  EXPECT_NE(e.find("optim.learning_rate"), std::string::npos) << e;
  e = error_of("[optim]\nwarmup_step = 10\n");
  EXPECT_NE(e.find("did you mean 'optim.warmup_steps'"), std::string::npos) << e;
  e = error_of("[train]\nlr = 1e-3\n");
  EXPECT_NE(e.find("did you mean 'optim.lr'"), std::string::npos) << e;
  e = error_of("[optim]\nlearning_rate = 1e-3\n");
  EXPECT_NE(e.find("did you mean 'optim.lr'"), std::string::npos) << e;  // nanoGPT's name
  e = error_of("[batch]\nblock_size = 64\n");
  EXPECT_NE(e.find("did you mean 'batch.seq_len'"), std::string::npos) << e;
  e = error_of("", {"model.n_layers=3"});
  EXPECT_NE(e.find("did you mean 'model.n_layer'"), std::string::npos) << e;
}

TEST(TrainConfig, BadValuesNameTheKey) {
  EXPECT_NE(error_of("[train]\nsteps = \"many\"\n").find("'train.steps'"), std::string::npos);
  EXPECT_NE(error_of("[train]\nsteps = -3\n").find("must be positive"), std::string::npos);
  EXPECT_NE(error_of("[train]\nprecision = \"fp8\"\n").find("bf16"), std::string::npos);
  EXPECT_NE(error_of("[model]\npreset = \"gpt5\"\n").find("gpt2-124m"), std::string::npos);
  EXPECT_NE(error_of("[model]\nnorm = \"batchnorm\"\n").find("layernorm, rmsnorm"),
            std::string::npos);
  EXPECT_NE(error_of("[train\nsteps = 3\n").find("malformed TOML"), std::string::npos);
  EXPECT_NE(error_of("[batch]\nseq_len = 1000\n").find("model.seq_len"), std::string::npos);
  EXPECT_NE(error_of("", {"nonsense"}).find("section.key=value"), std::string::npos);
}

TEST(TrainConfig, GlobalBatchIsDerivedOrRejectedWithTheFormula) {
  TrainConfig c;
  c.micro_batch = 4;
  c.global_batch = 32;
  c.resolve_batch(2);
  EXPECT_EQ(c.micro_batches, 4);

  c = TrainConfig();
  c.micro_batches = 2;
  c.global_batch = 16;
  c.resolve_batch(2);
  EXPECT_EQ(c.micro_batch, 4);

  c = TrainConfig();
  c.micro_batch = 4;
  c.micro_batches = 2;
  c.global_batch = 12;
  try {
    c.resolve_batch(1);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("global_batch = micro_batch × micro_batches × dp"),
              std::string::npos)
        << e.what();
  }

  c = TrainConfig();
  c.micro_batch = 3;
  c.global_batch = 16;
  EXPECT_THROW(c.resolve_batch(1), ConfigError);  // 16 is not a multiple of 3

  c = TrainConfig();
  c.global_batch = 16;
  EXPECT_THROW(c.resolve_batch(1), ConfigError);  // one number is not enough
}

}  // namespace
}  // namespace lattice
