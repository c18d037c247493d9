// The trainer end to end on a small corpus: determinism, micro-batching that does not change
// the math, and bf16 mixed precision tracking fp32.
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "test_corpus.h"

namespace lattice {
namespace {

TrainConfig small_config(const std::filesystem::path& data) {
  TrainConfig c;
  c.model = model_preset("gpt2-tiny");
  c.model.seq_len = 32;
  c.data_dir = data.string();
  c.seq_len = 32;
  c.micro_batch = 8;
  c.micro_batches = 1;
  c.lr = 1e-3f;
  c.min_lr = 1e-4f;
  c.warmup_steps = 2;
  c.steps = 8;
  c.decay_steps = 8;
  c.adam.lr = c.lr;
  c.threads = 1;
  c.eval_batches = 4;
  return c;
}

std::vector<double> losses_of(TrainConfig config, int steps, std::vector<float>* params = nullptr) {
  Arena arena("test");
  Trainer trainer(config, arena);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) losses.push_back(trainer.train_step().loss);
  if (params != nullptr) {
    const Tensor& master = trainer.model().parameters().master();
    params->assign(master.data<float>(), master.data<float>() + master.numel());
  }
  return losses;
}

TEST(Trainer, SameSeedTwiceIsBitwiseIdentical) {
  auto dir = testing::make_corpus_dir("determinism");
  std::vector<float> a_params, b_params;
  auto a = losses_of(small_config(dir), 5, &a_params);
  auto b = losses_of(small_config(dir), 5, &b_params);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;
  ASSERT_EQ(a_params.size(), b_params.size());
  EXPECT_EQ(std::memcmp(a_params.data(), b_params.data(), a_params.size() * sizeof(float)), 0);
}

#if defined(LATTICE_HAVE_MKL)
// train.gemm_library = "mkl": every GEMM of the step runs in oneMKL. The losses follow oneDNN's
// to fp32 (bf16) rounding, differ from them in the last bits (so oneMKL really ran: another
// summation order), and a second run repeats the first bit for bit.
TEST(Trainer, OneMklGemmsTrackOneDnnAndRepeatBitForBit) {
  auto dir = testing::make_corpus_dir("gemm_library");
  for (DType precision : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(precision));
    TrainConfig onednn = small_config(dir);
    onednn.compute_dtype = precision;
    TrainConfig mkl = onednn;
    mkl.gemm_library = GemmLibrary::kMkl;
    std::vector<float> mkl_params, mkl_again_params;
    const auto a = losses_of(onednn, 6);
    const auto b = losses_of(mkl, 6, &mkl_params);
    EXPECT_EQ(gemm_library(), GemmLibrary::kMkl) << "the trainer chose the configured library";
    const auto c = losses_of(mkl, 6, &mkl_again_params);
    set_gemm_library(GemmLibrary::kOneDnn);
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::abs(a[i] - b[i]) / a[i]);
      EXPECT_EQ(b[i], c[i]) << "step " << i;
    }
    EXPECT_LT(worst, precision == DType::kF32 ? 1e-5 : 1e-2);
    EXPECT_GT(worst, 0.0) << "oneMKL gave oneDNN's bits at every step: was it called?";
    EXPECT_EQ(
        std::memcmp(mkl_params.data(), mkl_again_params.data(), mkl_params.size() * sizeof(float)),
        0);
  }
}
#endif

TEST(Trainer, MicroBatchingDoesNotChangeTheMath) {
  auto dir = testing::make_corpus_dir("microbatch");
  TrainConfig whole = small_config(dir);  // 1 × 8
  TrainConfig split = whole;
  split.micro_batch = 2;
  split.micro_batches = 4;  // 4 × 2: the same global batch
  auto a = losses_of(whole, 6);
  auto b = losses_of(split, 6);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(a[i])) << "step " << i;
  }
}

// Clipping reaches the update through the optimizer's fused grad_scale: a threshold the norm
// never reaches is bitwise no clipping at all, and one far below the norm changes every step.
TEST(Trainer, ClippingChangesTheUpdateOnlyWhenTheNormExceedsTheThreshold) {
  auto dir = testing::make_corpus_dir("clipping");
  TrainConfig off = small_config(dir);
  off.grad_clip = 0.0f;
  TrainConfig never = off;
  never.grad_clip = 1e9f;
  TrainConfig always = off;
  always.grad_clip = 1e-3f;
  std::vector<float> off_params, never_params, always_params;
  const auto off_losses = losses_of(off, 4, &off_params);
  const auto never_losses = losses_of(never, 4, &never_params);
  const auto always_losses = losses_of(always, 4, &always_params);
  ASSERT_EQ(off_params.size(), always_params.size());
  EXPECT_EQ(off_losses, never_losses);
  EXPECT_EQ(std::memcmp(off_params.data(), never_params.data(), off_params.size() * sizeof(float)),
            0);
  EXPECT_EQ(off_losses[0], always_losses[0]) << "the first loss precedes any update";
  // AdamW normalises by the gradients' own scale, so a clip factor changes the update through
  // its step-to-step variation and eps: small, but in every parameter tensor's bits.
  for (size_t s = 1; s < off_losses.size(); ++s) EXPECT_NE(off_losses[s], always_losses[s]) << s;
  size_t changed = 0;
  for (size_t i = 0; i < off_params.size(); ++i) changed += off_params[i] != always_params[i];
  EXPECT_GT(changed, off_params.size() / 2);
}

TEST(Trainer, LossFallsAndValidationWorks) {
  auto dir = testing::make_corpus_dir("learns");
  TrainConfig c = small_config(dir);
  c.steps = c.decay_steps = 40;
  Arena arena("test");
  Trainer trainer(c, arena);
  ASSERT_TRUE(trainer.has_validation());
  double before = trainer.evaluate();
  for (int s = 0; s < 40; ++s) trainer.train_step();
  double after = trainer.evaluate();
  EXPECT_NEAR(before, std::log(256.0), 0.2);
  EXPECT_LT(after, 0.7 * before) << before << " -> " << after;
  EXPECT_EQ(trainer.step(), 40);
}

// bf16 compute with fp32 master weights follows the fp32 run: over 50 steps each step's loss
// stays within 3% (bf16 keeps 8 mantissa bits, so matmul inputs carry ~0.4% relative rounding;
// the curves separate slowly as updates differ).
TEST(Trainer, Bf16TracksFp32Within3PercentOver50Steps) {
  auto dir = testing::make_corpus_dir("bf16");
  TrainConfig fp32 = small_config(dir);
  fp32.steps = fp32.decay_steps = 50;
  TrainConfig bf16 = fp32;
  bf16.compute_dtype = DType::kBF16;
  auto a = losses_of(fp32, 50);
  auto b = losses_of(bf16, 50);
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]) / a[i]);
    std::printf("%zu %.5f %.5f\n", i, a[i], b[i]);
  }
  EXPECT_LT(worst, 0.03);
  // bf16 really ran: rounded operands move the losses (fp32 twice gives the same bits).
  EXPECT_GT(worst, 1e-6);
  EXPECT_LT(a.back(), 0.8 * a.front());
}

TEST(Trainer, MissingDataIsAClearErrorWithTheFix) {
  TrainConfig c = small_config("/nonexistent/lattice-data");
  Arena arena("test");
  try {
    Trainer trainer(c, arena);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lattice data prepare"), std::string::npos) << e.what();
  }
}

TEST(Trainer, ATokenOutsideTheVocabularyIsCaughtWhenTheDataIsOpened) {
  auto dir = testing::make_corpus_dir("big_token");
  std::vector<int32_t> tokens = testing::corpus_tokens(4000, 3);
  tokens[1234] = 300;  // gpt2-tiny's vocabulary is 256 (the byte tokenizer)
  write_token_file(dir / "val.bin", tokens);
  Arena arena("test");
  try {
    Trainer trainer(small_config(dir), arena);
    FAIL() << "a token id of 300 reached a model of vocabulary 256";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("val.bin: token 1234 is id 300"), std::string::npos) << message;
    EXPECT_NE(message.find("vocabulary of 256 (model.vocab_size)"), std::string::npos) << message;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lattice
