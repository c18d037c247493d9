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
#include "train/train_config.h"
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
      {"model.norm_eps", [](TrainConfig& c) { c.model.norm_eps = 1e-6f; }, "saved 1e-05",
       "now 1e-06"},
      {"model.n_head", [](TrainConfig& c) { c.model.n_head = c.model.n_kv_head = 2; }, "saved 4",
       "now 2"},
      {"optim.beta2", [](TrainConfig& c) { c.adam.beta2 = 0.99f; }, "saved 0.95", "now 0.99"},
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

// The guard of the list: a new config key must be either compared by a resume or named free
// (with its reason, in trainer_checkpoint.cpp), never both, never neither.
TEST(ResumeKeys, EveryConfigKeyIsComparedOrFreeAndNeverBoth) {
  TrainConfig config;
  config.model = model_preset("mixtral-tiny");  // a sparse model: its expert keys too
  const nlohmann::json compared =
      resume_keys(config, TrainingFileIdentity{.tokens = 1, .checksum = 2});
  const std::vector<std::string>& free = resume_free_keys();
  const std::vector<std::string> keys = train_config_keys();
  for (const std::string& key : keys) {
    const bool is_free = std::find(free.begin(), free.end(), key) != free.end();
    EXPECT_NE(compared.contains(key), is_free) << key << (is_free ? ": both" : ": neither");
  }
  for (const auto& item : compared.items()) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), item.key()), keys.end()) << item.key();
  }
  for (const std::string& key : free) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), key), keys.end()) << key;
  }
  EXPECT_TRUE(compared.contains("model.experts_per_token"));
  EXPECT_TRUE(compared.contains("model.capacity_factor"));
}

// The data is identified by its tokens: a file of the same size with one token changed is
// refused, naming both checksums; the same tokens under another directory resume.
TEST_F(ResumeChecks, TheDataIsComparedByItsContentsNotByItsPathOrSize) {
  const TokenFile original(*data_ / "train.bin");
  std::vector<int32_t> tokens(original.tokens().begin(), original.tokens().end());
  const fs::path copy = testing::scratch_dir("resume_checks_copy_" + std::to_string(::getpid()));
  fs::copy_file(*data_ / "val.bin", copy / "val.bin");
  write_token_file(copy / "train.bin", tokens);
  TrainConfig config = config_for(*data_);
  config.data_dir = copy.string();
  EXPECT_EQ(resume_error(config), "");

  tokens[tokens.size() / 2] = tokens[tokens.size() / 2] == 'a' ? 'b' : 'a';
  write_token_file(copy / "train.bin", tokens);
  const std::string error = resume_error(config);
  const std::string saved = fmt::format("{:08x}", original.content_checksum());
  EXPECT_NE(error.find(fmt::format("data.dir: saved a train.bin of {} tokens with CRC32C {}",
                                   tokens.size(), saved)),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("--resume-allow-change data.dir"), std::string::npos) << error;
  EXPECT_EQ(resume_error(config, {.allow_changes = {"data.dir"}}), "");
  fs::remove_all(copy);
}

// A checkpoint written before the checksum was recorded has the token count only: that is
// what is compared.
TEST(ResumeKeys, AnOlderCheckpointsTokenCountIsStillCompared) {
  const nlohmann::json now = {{"data.dir", {{"tokens", 100}, {"crc32c", "0000abcd"}}}};
  EXPECT_TRUE(resume_changes({{"data.dir", 100}}, now).empty());
  const std::vector<ResumeChange> changes = resume_changes({{"data.dir", 99}}, now);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].saved, "a train.bin of 99 tokens");
  EXPECT_EQ(changes[0].now, "a train.bin of 100 tokens with CRC32C 0000abcd");
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
