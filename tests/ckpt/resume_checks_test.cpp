// A resume continues the run that saved the checkpoint or refuses (issue: "resume restores what
// it saved"): the keys that change the math are compared and named with both values, an allowed
// change of the global batch reads the data stream on from the saved position, and the data
// position goes through the loader's checked seek.
#include <gtest/gtest.h>
#include <unistd.h>

#include "../train/equivalence_config.h"
#include "../train/test_corpus.h"
#include "ckpt/checkpoint.h"
#include "ckpt/trainer_checkpoint.h"
#include "train/trainer.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

TrainConfig config_for(const fs::path& data) {
  ModelConfig model = model_preset("gpt2-tiny");
  model.seq_len = 12;
  return testing::equivalence_config(model, data, {.steps = 6});
}

class ResumeChecks : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new fs::path(testing::make_corpus_dir("resume_checks_" + std::to_string(::getpid())));
    root_ = new fs::path(*data_ / "checkpoints");
    const TrainConfig config = config_for(*data_);
    Arena arena("save");
    Trainer trainer(config, arena);
    trainer.train_step();
    trainer.train_step();
    saved_position_ = new DataPosition(trainer.data_position());
    dir_ = new fs::path(save_trainer_checkpoint(*root_, trainer, nullptr));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*data_);
    delete data_;
    delete root_;
    delete dir_;
    delete saved_position_;
  }
  // The error of resuming the checkpoint into a trainer of `config` ("" when it resumes).
  static std::string resume_error(const TrainConfig& config, const ResumeOptions& options = {}) {
    Arena arena("load");
    Trainer trainer(config, arena);
    try {
      load_trainer_checkpoint(*dir_, trainer, options);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  static fs::path* data_;
  static fs::path* root_;
  static fs::path* dir_;
  static DataPosition* saved_position_;
};
fs::path* ResumeChecks::data_ = nullptr;
fs::path* ResumeChecks::root_ = nullptr;
fs::path* ResumeChecks::dir_ = nullptr;
DataPosition* ResumeChecks::saved_position_ = nullptr;

TEST_F(ResumeChecks, TheSameConfigResumesAtTheSavedDataPosition) {
  Arena arena("load");
  Trainer trainer(config_for(*data_), arena);
  const TrainingState state = load_trainer_checkpoint(*dir_, trainer);
  EXPECT_EQ(state.step, 2);
  EXPECT_EQ(trainer.step(), 2);
  EXPECT_EQ(trainer.data_position(), *saved_position_);
}

TEST_F(ResumeChecks, EveryKeyThatChangesTheMathIsRefusedNamingBothValues) {
  struct Change {
    std::string key;
    std::function<void(TrainConfig&)> apply;
    std::string saved, now;
  };
  const std::vector<Change> changes = {
      {"batch.global_batch", [](TrainConfig& c) { c.global_batch = 16; }, "saved 8", "now 16"},
      {"train.seed", [](TrainConfig& c) { c.seed = 7; }, "saved 1337", "now 7"},
      {"data.mode", [](TrainConfig& c) { c.data_mode = SamplingMode::kSequential; },
       "saved \"shuffled\"", "now \"sequential\""},
      {"optim.decay_steps", [](TrainConfig& c) { c.decay_steps = 12; }, "saved 6", "now 12"},
      {"optim.lr", [](TrainConfig& c) { c.lr = c.adam.lr = 1e-3f; }, "saved 0.003", "now 0.001"},
      {"train.precision", [](TrainConfig& c) { c.compute_dtype = DType::kBF16; }, "saved \"fp32\"",
       "\"bf16\""},
  };
  for (const Change& change : changes) {
    TrainConfig config = config_for(*data_);
    change.apply(config);
    const std::string error = resume_error(config);
    EXPECT_NE(error.find(change.key + ": " + change.saved), std::string::npos)
        << change.key << ": " << error;
    EXPECT_NE(error.find(change.now), std::string::npos) << change.key << ": " << error;
    EXPECT_NE(error.find("--resume-allow-change " + change.key), std::string::npos) << error;
  }
  // Not the math: the layout and the log cadence change freely.
  TrainConfig config = config_for(*data_);
  config.log_interval = 5;
  config.eval_interval = 3;
  EXPECT_EQ(resume_error(config), "");
}

TEST_F(ResumeChecks, AnAllowedBatchChangeReadsOnFromTheSavedSequence) {
  TrainConfig config = config_for(*data_);
  config.global_batch = 16;
  Arena arena("load");
  Trainer trainer(config, arena);
  load_trainer_checkpoint(*dir_, trainer, {.allow_changes = {"batch.global_batch"}});
  // Batch 2 of the resumed run starts at sequence 2·8 = 16, not 2·16 = 32.
  EXPECT_EQ(trainer.data_position(), *saved_position_);
  const int64_t windows = (trainer.train_tokens() - 1) / config.seq_len;
  auto sequence = [&](const DataPosition& p) { return p.epoch * windows + p.index; };
  EXPECT_EQ(sequence(*saved_position_), 2 * 8);
  trainer.train_step();
  EXPECT_EQ(sequence(trainer.data_position()), 2 * 8 + 16);
  // Without the allowance the same change is refused.
  EXPECT_NE(resume_error(config).find("batch.global_batch: saved 8, now 16"), std::string::npos);
}

TEST_F(ResumeChecks, AnUnknownAllowedKeyIsAConfigErrorListingTheKeys) {
  const std::string error =
      resume_error(config_for(*data_), {.allow_changes = {"batch.global_bach"}});
  EXPECT_NE(error.find("not a key a resume compares"), std::string::npos) << error;
  EXPECT_NE(error.find("batch.global_batch"), std::string::npos) << error;
}

}  // namespace
}  // namespace lattice
