// Exact resume at the library level: train k steps, checkpoint, load into fresh objects and
// continue; the per-step losses and the final weights and moments are bitwise those of the
// uninterrupted run. Each step's batch is a pure function of (seed, step) as in the trainer.
#include <gtest/gtest.h>

#include <cstring>

#include "ckpt/checkpoint.h"
#include "core/philox.h"
#include "support/scratch_dir.h"
#include "train/lr_schedule.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBatch = 2, kSeq = 8;

struct TrainingRun {
  Arena arena{"run"};
  TrainConfig config;
  Transformer model;
  AdamW optimizer;
  LrSchedule schedule{.max_lr = 3e-3f, .min_lr = 3e-4f, .warmup_steps = 2, .decay_steps = 8};
  TrainingState state;

  explicit TrainingRun(const TrainConfig& c)
      : config(c),
        model(c.model, arena, DType::kF32),
        optimizer(model.parameters(), arena, c.adam) {}

  // One optimizer step on the batch of the current data position; returns the loss.
  double step() {
    std::vector<int32_t> tokens(kBatch * (kSeq + 1));
    PhiloxStream rng(state.seed, uint64_t(state.data.index));
    for (auto& t : tokens) t = int32_t(rng.next_below(uint64_t(config.model.vocab_size)));
    std::vector<int32_t> inputs, targets;
    for (int64_t b = 0; b < kBatch; ++b) {
      inputs.insert(inputs.end(), tokens.begin() + b * (kSeq + 1),
                    tokens.begin() + b * (kSeq + 1) + kSeq);
      targets.insert(targets.end(), tokens.begin() + b * (kSeq + 1) + 1,
                     tokens.begin() + (b + 1) * (kSeq + 1));
    }
    model.parameters().zero_grads();
    ForwardResult r = model.forward(Tensor::borrow(inputs.data(), {kBatch, kSeq}, DType::kI32),
                                    Tensor::borrow(targets.data(), {kBatch, kSeq}, DType::kI32));
    model.backward(1.0f / float(kBatch * kSeq));
    optimizer.step(schedule.at(state.lr_step));
    ++state.step;
    ++state.lr_step;
    ++state.data.index;
    return r.loss_sum;
  }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(ExactResume, StoppingAndResumingIsBitwiseTheUninterruptedRun) {
  TrainConfig config;
  config.model = model_preset("gpt2-tiny");
  config.seed = 77;
  constexpr int kStop = 3, kTotal = 6;

  TrainingRun uninterrupted(config);
  uninterrupted.model.initialize(config.seed);
  uninterrupted.state.seed = config.seed;
  uninterrupted.state.data.seed = config.seed;
  std::vector<double> losses;
  for (int i = 0; i < kTotal; ++i) losses.push_back(uninterrupted.step());

  TrainingRun first(config);
  first.model.initialize(config.seed);
  first.state = {.step = 0, .lr_step = 0, .data = {.seed = config.seed}, .seed = config.seed};
  for (int i = 0; i < kStop; ++i) ASSERT_EQ(first.step(), losses[size_t(i)]);
  fs::path root = testing::scratch_dir("exact_resume");
  fs::path dir = save_training_checkpoint(root, config, first.model, first.optimizer, first.state);

  TrainingRun resumed(config);
  resumed.model.initialize(config.seed + 1);  // different weights, all overwritten by the load
  resumed.state = load_training_checkpoint(dir, resumed.model, resumed.optimizer);
  EXPECT_EQ(resumed.state, first.state);
  EXPECT_EQ(resumed.optimizer.steps_taken(), kStop);
  for (int i = kStop; i < kTotal; ++i) {
    EXPECT_EQ(resumed.step(), losses[size_t(i)]) << "loss of step " << i;
  }
  ParameterStore& a = uninterrupted.model.parameters();
  ParameterStore& b = resumed.model.parameters();
  EXPECT_TRUE(same_bytes(a.master(), b.master()));
  EXPECT_TRUE(same_bytes(uninterrupted.optimizer.m(), resumed.optimizer.m()));
  EXPECT_TRUE(same_bytes(uninterrupted.optimizer.v(), resumed.optimizer.v()));
  EXPECT_EQ(uninterrupted.state, resumed.state);
}

TEST(ExactResume, AModelOfAnotherShapeIsRefusedListingBoth) {
  TrainConfig config;
  config.model = model_preset("gpt2-tiny");
  TrainingRun run(config);
  run.model.initialize(1);
  fs::path root = testing::scratch_dir("other_shape");
  fs::path dir = save_training_checkpoint(root, config, run.model, run.optimizer, run.state);
  TrainConfig wider = config;
  wider.model.d_model = 2 * config.model.d_model;
  wider.model.d_ff = 2 * config.model.d_ff;
  TrainingRun other(wider);
  try {
    load_training_checkpoint(dir, other.model, other.optimizer);
    FAIL() << "loaded weights of another shape";
  } catch (const ShapeError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(config.model.d_model)), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(wider.model.d_model)), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace lattice
