#include "data/token_loader.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <thread>

#include "core/error.h"
#include "data/window_order.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

// Token i of the test file has value i, so a token's value tells where it was read from.
constexpr int64_t kTokens = 1003;
constexpr int64_t kT = 8;
constexpr int64_t kB = 6;
constexpr int64_t kWindows = (kTokens - 1) / kT;  // 125: batches straddle the epoch end

class TokenLoaderTest : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    std::vector<int32_t> tokens(kTokens);
    for (int64_t i = 0; i < kTokens; ++i) tokens[size_t(i)] = int32_t(i);
    write_token_file(dir_ / "tokens.bin", tokens);
    file_ = std::make_shared<const TokenFile>(dir_ / "tokens.bin");
  }
  TokenLoader loader(SamplingMode mode, uint64_t seed = 0, int64_t B = kB) const {
    return TokenLoader(file_, {mode, seed, B, kT});
  }
  // The token each row starts at, after checking that every row is one contiguous window of
  // T + 1 tokens with targets shifted by one.
  static std::vector<int64_t> row_starts(const TokenBatch& batch) {
    std::vector<int64_t> starts;
    const int32_t* in = batch.inputs.data<int32_t>();
    const int32_t* out = batch.targets.data<int32_t>();
    for (int64_t r = 0; r < batch.inputs.dim(0); ++r) {
      for (int64_t t = 0; t < kT; ++t) {
        EXPECT_EQ(in[r * kT + t], in[r * kT] + t) << "row " << r;
        EXPECT_EQ(out[r * kT + t], in[r * kT] + t + 1) << "row " << r;
      }
      starts.push_back(in[r * kT]);
    }
    return starts;
  }
  static bool same_values(const TokenBatch& a, const TokenBatch& b) {
    return a.inputs.shape() == b.inputs.shape() &&
           std::equal(a.inputs.data<int32_t>(), a.inputs.data<int32_t>() + a.inputs.numel(),
                      b.inputs.data<int32_t>()) &&
           std::equal(a.targets.data<int32_t>(), a.targets.data<int32_t>() + a.targets.numel(),
                      b.targets.data<int32_t>());
  }

  Arena arena_{"data_test", size_t(1) << 20};
  std::shared_ptr<const TokenFile> file_;
};

TEST_F(TokenLoaderTest, SequentialBatchesAreTheDocumentedWindows) {
  TokenLoader sequential = loader(SamplingMode::kSequential);
  EXPECT_EQ(sequential.windows_per_epoch(), kWindows);
  TokenBatch batch = make_token_batch(arena_, kB, kT);
  for (int64_t k : {0, 1, 7, 20, 21, 41, 1000}) {
    sequential.read_batch(k, batch.inputs, batch.targets);
    std::vector<int64_t> starts = row_starts(batch);
    for (int64_t b = 0; b < kB; ++b) {
      // Row b of batch k starts at token (k·B + b)·T, wrapping to window 0 after the last
      // whole window (the tail token 1001..1002 beyond it is never read as a start).
      EXPECT_EQ(starts[size_t(b)], ((k * kB + b) % kWindows) * kT) << "batch " << k << " row " << b;
    }
  }
  // Batch 20 straddles the end: rows 0..4 are windows 120..124, row 5 wraps to window 0.
  sequential.read_batch(20, batch.inputs, batch.targets);
  EXPECT_EQ(row_starts(batch), (std::vector<int64_t>{960, 968, 976, 984, 992, 0}));
  // The last window's last target is token 1000: the final whole window ends there.
  EXPECT_EQ(batch.targets.data<int32_t>()[4 * kT + kT - 1], 1000);
}

TEST_F(TokenLoaderTest, ShuffledEpochIsAPermutationOfTheWindows) {
  TokenLoader shuffled = loader(SamplingMode::kShuffled, 1234);
  std::vector<int64_t> starts;
  for (int64_t s = 0; s < kWindows; ++s) starts.push_back(shuffled.window_start(s));
  std::vector<int64_t> sorted = starts;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t w = 0; w < kWindows; ++w) EXPECT_EQ(sorted[size_t(w)], w * kT);
  // A shuffle that left the order alone would not be one.
  int64_t in_place = 0;
  for (int64_t w = 0; w < kWindows; ++w) in_place += starts[size_t(w)] == w * kT;
  EXPECT_LT(in_place, 10);
}

TEST_F(TokenLoaderTest, ShuffledOrderIsAPureFunctionOfSeedAndEpoch) {
  TokenLoader a = loader(SamplingMode::kShuffled, 7);
  TokenLoader b = loader(SamplingMode::kShuffled, 7);
  TokenLoader other_seed = loader(SamplingMode::kShuffled, 8);
  auto epoch_starts = [](const TokenLoader& l, int64_t epoch) {
    std::vector<int64_t> starts;
    for (int64_t p = 0; p < kWindows; ++p) starts.push_back(l.window_start(epoch * kWindows + p));
    return starts;
  };
  // b visits epochs in another order (and so rebuilds its cache): the orders do not change.
  std::vector<int64_t> b_epoch3 = epoch_starts(b, 3);
  std::vector<int64_t> b_epoch0 = epoch_starts(b, 0);
  EXPECT_EQ(epoch_starts(a, 0), b_epoch0);
  EXPECT_EQ(epoch_starts(a, 3), b_epoch3);
  EXPECT_NE(epoch_starts(a, 0), epoch_starts(a, 1));
  EXPECT_NE(epoch_starts(a, 0), epoch_starts(other_seed, 0));
  // The loader's order is shuffled_window_order's.
  std::vector<uint32_t> order = shuffled_window_order(7, 3, kWindows);
  for (int64_t p = 0; p < kWindows; ++p)
    EXPECT_EQ(b_epoch3[size_t(p)], int64_t(order[size_t(p)]) * kT);
}

class TokenLoaderSlices : public TokenLoaderTest,
                          public ::testing::WithParamInterface<SamplingMode> {};

// However a global batch is split over ranks and micro-batches, the rows are the same tokens.
TEST_P(TokenLoaderSlices, SlicesEqualTheRowsOfTheWholeBatch) {
  TokenLoader l = loader(GetParam(), 99);
  TokenBatch whole = make_token_batch(arena_, kB, kT);
  const std::vector<std::vector<int64_t>> splits{
      {0, 6}, {0, 3, 6}, {0, 2, 4, 6}, {0, 1, 5, 6}, {0, 1, 2, 3, 4, 5, 6}};
  for (int64_t k : {0, 3, 20, 41, 62}) {  // 20, 41 and 62 straddle epoch ends
    l.read_batch(k, whole.inputs, whole.targets);
    for (const auto& cuts : splits) {
      for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        TokenBatch part = make_token_batch(arena_, cuts[i + 1] - cuts[i], kT);
        l.read_batch_rows(k, cuts[i], cuts[i + 1], part.inputs, part.targets);
        TokenBatch expected{whole.inputs.slice_rows(cuts[i], cuts[i + 1]),
                            whole.targets.slice_rows(cuts[i], cuts[i + 1])};
        EXPECT_TRUE(same_values(part, expected)) << "batch " << k << " rows " << cuts[i];
      }
    }
  }
}

// A run that saves its position and resumes reads what the uninterrupted run reads.
TEST_P(TokenLoaderSlices, ResumeFromASavedPositionContinuesIdentically) {
  for (int64_t saved_after : {0, 5, 20, 21, 44}) {
    TokenLoader uninterrupted = loader(GetParam(), 5);
    TokenBatch expected = make_token_batch(arena_, kB, kT);
    TokenBatch got = make_token_batch(arena_, kB, kT);
    for (int64_t k = 0; k < saved_after; ++k) uninterrupted.next(expected.inputs, expected.targets);
    std::string saved = data_position_to_json(uninterrupted.position()).dump();

    TokenLoader resumed = loader(GetParam(), 5);
    resumed.seek(data_position_from_json(nlohmann::json::parse(saved)));
    EXPECT_EQ(resumed.position(), uninterrupted.position());
    for (int64_t k = saved_after; k < saved_after + 30; ++k) {
      uninterrupted.next(expected.inputs, expected.targets);
      resumed.next(got.inputs, got.targets);
      ASSERT_TRUE(same_values(expected, got)) << "saved after " << saved_after << ", batch " << k;
      // The cursor and random access agree: the batch at the cursor was global batch k.
      uninterrupted.read_batch(k, got.inputs, got.targets);
      ASSERT_TRUE(same_values(expected, got)) << "batch " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, TokenLoaderSlices,
                         ::testing::Values(SamplingMode::kSequential, SamplingMode::kShuffled),
                         [](const auto& info) {
                           return std::string(sampling_mode_name(info.param));
                         });

// Ranks as threads share one loader (const reads, one shuffle cache) and each reads its rows
// of every batch while the others move the cache through the epochs.
TEST_F(TokenLoaderTest, ConcurrentRanksReadTheirRowsOfTheSameBatches) {
  const TokenLoader shared = loader(SamplingMode::kShuffled, 21);
  constexpr int kRanks = 3;
  constexpr int64_t kRowsPerRank = kB / kRanks;
  constexpr int64_t kBatches = 130;  // 6 epochs, so the cache evicts while the ranks read
  std::vector<std::vector<int32_t>> got(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      Arena arena("rank", size_t(1) << 16);
      TokenBatch part = make_token_batch(arena, kRowsPerRank, kT);
      for (int64_t k = 0; k < kBatches; ++k) {
        shared.read_batch_rows(k, r * kRowsPerRank, (r + 1) * kRowsPerRank, part.inputs,
                               part.targets);
        got[size_t(r)].insert(got[size_t(r)].end(), part.inputs.data<int32_t>(),
                              part.inputs.data<int32_t>() + part.inputs.numel());
      }
    });
  }
  for (auto& t : ranks) t.join();
  TokenLoader serial = loader(SamplingMode::kShuffled, 21);
  TokenBatch whole = make_token_batch(arena_, kB, kT);
  for (int64_t k = 0; k < kBatches; ++k) {
    serial.read_batch(k, whole.inputs, whole.targets);
    for (int r = 0; r < kRanks; ++r) {
      const int32_t* expected = whole.inputs.data<int32_t>() + r * kRowsPerRank * kT;
      const int32_t* actual = got[size_t(r)].data() + k * kRowsPerRank * kT;
      ASSERT_TRUE(std::equal(expected, expected + kRowsPerRank * kT, actual))
          << "rank " << r << " batch " << k;
    }
  }
}

TEST_F(TokenLoaderTest, PositionCountsWindowsAcrossEpochs) {
  TokenLoader l = loader(SamplingMode::kShuffled, 3);
  for (int i = 0; i < 21; ++i) l.advance();  // 126 windows: one epoch and one window
  EXPECT_EQ(l.position(), (DataPosition{SamplingMode::kShuffled, 3, 1, 1}));
  EXPECT_EQ(data_position_to_json(l.position()),
            nlohmann::json::parse(R"({"mode":"shuffled","seed":3,"epoch":1,"index":1})"));
}

TEST_F(TokenLoaderTest, ResumingUnderAnotherSetupIsRefused) {
  TokenLoader shuffled = loader(SamplingMode::kShuffled, 3);
  EXPECT_THROW(shuffled.seek({SamplingMode::kSequential, 3, 0, 0}), ConfigError);
  EXPECT_THROW(shuffled.seek({SamplingMode::kShuffled, 4, 0, 0}), ConfigError);
  EXPECT_THROW(shuffled.seek({SamplingMode::kShuffled, 3, 0, kWindows}), ConfigError);
  shuffled.seek({SamplingMode::kShuffled, 3, 2, kWindows - 1});
  EXPECT_EQ(shuffled.position().index, kWindows - 1);
}

TEST_F(TokenLoaderTest, BadArgumentsAreNamed) {
  EXPECT_THROW(TokenLoader(file_, {SamplingMode::kSequential, 0, 0, kT}), ConfigError);
  EXPECT_THROW(TokenLoader(file_, {SamplingMode::kSequential, 0, 1, 0}), ConfigError);
  try {
    TokenLoader(file_, {SamplingMode::kSequential, 0, 1, kTokens});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 1003 tokens, fewer than one window"),
              std::string::npos)
        << e.what();
  }
  TokenLoader l = loader(SamplingMode::kSequential);
  TokenBatch wrong_rows = make_token_batch(arena_, 2, kT);
  EXPECT_THROW(l.read_batch(0, wrong_rows.inputs, wrong_rows.targets), ShapeError);
  EXPECT_THROW(l.read_batch_rows(0, 5, 7, wrong_rows.inputs, wrong_rows.targets), ShapeError);
  Tensor floats = Tensor::empty(arena_, Shape{kB, kT}, DType::kF32);
  TokenBatch batch = make_token_batch(arena_, kB, kT);
  EXPECT_THROW(l.read_batch(0, floats, batch.targets), DTypeError);
}

TEST(DataPosition, JsonRoundTripAndErrors) {
  DataPosition position{SamplingMode::kShuffled, 18446744073709551615ull, 12, 345};
  EXPECT_EQ(data_position_from_json(nlohmann::json::parse(data_position_to_json(position).dump())),
            position);
  EXPECT_THROW(
      data_position_from_json(nlohmann::json::parse(R"({"mode":"shuffled","seed":1,"epoch":0})")),
      ConfigError);
  EXPECT_THROW(data_position_from_json(
                   nlohmann::json::parse(R"({"mode":"random","seed":1,"epoch":0,"index":0})")),
               ConfigError);
  EXPECT_THROW(data_position_from_json(
                   nlohmann::json::parse(R"({"mode":"shuffled","seed":1,"epoch":-1,"index":0})")),
               ConfigError);
  EXPECT_THROW(data_position_from_json(nlohmann::json::parse("[1, 2]")), ConfigError);
}

TEST(WindowOrder, IsAPermutationForEverySize) {
  for (int64_t windows : {0, 1, 2, 3, 17, 1000}) {
    std::vector<uint32_t> order = shuffled_window_order(11, 0, windows);
    std::set<uint32_t> seen(order.begin(), order.end());
    EXPECT_EQ(int64_t(seen.size()), windows);
    if (windows > 0) {
      EXPECT_EQ(int64_t(*seen.rbegin()), windows - 1);
    }
  }
}

}  // namespace
}  // namespace lattice
