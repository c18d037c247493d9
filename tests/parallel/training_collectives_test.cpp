// The collective tuner on the training path: the trainer's groups run the tuner's algorithm per
// message size, a slow link moves the dp gradient all-reduce off it at a step boundary with the
// losses of the pinned run (within reassociation, 1e-6), and the pinned mode
// (parallel.deterministic) runs ring everywhere and never switches.
#include <gtest/gtest.h>

#include <mutex>

#include "../train/test_corpus.h"
#include "comm/thread_world.h"
#include "train/trainer.h"

namespace lattice {
namespace {

constexpr int kDp = 4;
// The window of one gradient bucket closes after Tuner::kWindow steps (one call per step).
constexpr int kSteps = Tuner::kWindow + 4;

TrainConfig small_config(const std::filesystem::path& data) {
  TrainConfig c;
  c.model = model_preset("gpt2-tiny");
  c.model.seq_len = 16;
  c.data_dir = data.string();
  c.seq_len = 16;
  c.global_batch = 8;
  c.micro_batches = 1;
  c.lr = 3e-3f;
  c.warmup_steps = 1;
  c.steps = c.decay_steps = kSteps;
  c.adam.lr = c.lr;
  c.threads = 1;
  return c;
}

struct TunedRun {
  std::vector<double> losses;
  std::vector<TuningEvent> events;        // rank 0's dp group
  std::vector<size_t> events_after_step;  // rank 0's dp events once each step returned
  CommStats stats{kDp};                   // rank 0's dp group
};

TunedRun train(const std::filesystem::path& data, AlgorithmChoice algorithms,
               std::chrono::milliseconds link_delay) {
  ThreadWorldOptions world;
  world.config.algorithms = algorithms;
  world.setup = [link_delay](ThreadHub& hub) { hub.set_link_delay(0, 1, link_delay); };
  TunedRun run;
  std::mutex mutex;
  run_ranks(
      kDp,
      [&](Communicator& comm) {
        Arena arena(fmt::format("rank{}", comm.rank()));
        // One bucket: one all-reduce of the whole gradient per step.
        ParallelSetup setup{.dp = &comm, .bucket_bytes = 64 << 20, .threads = 1};
        Trainer trainer(small_config(data), arena, setup);
        std::vector<double> losses;
        std::vector<size_t> events_after_step;
        for (int s = 0; s < kSteps; ++s) {
          losses.push_back(trainer.train_step().loss);
          events_after_step.push_back(comm.tuning_events().size());
        }
        if (comm.rank() != 0) return;
        std::lock_guard lock(mutex);
        run.losses = losses;
        run.events = comm.tuning_events();
        run.events_after_step = events_after_step;
        run.stats = comm.stats();
      },
      world);
  return run;
}

TEST(TrainingCollectives, ASlowLinkMovesTheGradientAllReduceAtAStepBoundaryToThePinnedLosses) {
  const auto data = testing::make_corpus_dir("training_collectives_slow_link");
  const TunedRun tuned =
      train(data, AlgorithmChoice::kRetunedAtStepBoundary, std::chrono::milliseconds(20));
  const TunedRun pinned = train(data, AlgorithmChoice::kPinned, std::chrono::milliseconds(0));

  // The gradient all-reduce started on the model's choice (not ring on 4 ranks), ran one window
  // of steps over the slow link, and switched to the tree (which crosses the link 0 -> 1 once).
  const auto switched = std::find_if(tuned.events.begin(), tuned.events.end(), [](auto& e) {
    return e.collective == Collective::kAllReduce && e.before != e.after;
  });
  ASSERT_NE(switched, tuned.events.end()) << "the gradient all-reduce never switched";
  EXPECT_NE(switched->before, Algorithm::kRing);
  EXPECT_EQ(switched->after, Algorithm::kTree);
  EXPECT_GT(switched->slowdown, Tuner::kSlowdownThreshold);
  EXPECT_EQ(switched->measured_seconds.size(), 3u);
  // Not before the window of Tuner::kWindow steps had closed.
  EXPECT_EQ(tuned.events_after_step[Tuner::kWindow - 2], 0u);
  EXPECT_GT(tuned.stats.totals(Collective::kAllReduce, switched->before).calls, 0u);
  EXPECT_GT(tuned.stats.totals(Collective::kAllReduce, Algorithm::kTree).calls, 0u);

  // The pinned run: ring only, no event.
  EXPECT_TRUE(pinned.events.empty());
  const CollectiveTotals all = pinned.stats.totals(Collective::kAllReduce);
  EXPECT_GT(all.calls, 0u);
  EXPECT_EQ(pinned.stats.totals(Collective::kAllReduce, Algorithm::kRing).calls, all.calls);

  // Another summation order, the same training.
  ASSERT_EQ(tuned.losses.size(), pinned.losses.size());
  for (size_t i = 0; i < tuned.losses.size(); ++i) {
    EXPECT_NEAR(tuned.losses[i], pinned.losses[i], 1e-6 * pinned.losses[i]) << "step " << i + 1;
  }
  std::filesystem::remove_all(data);
}

TEST(TrainingCollectives, PinnedRunsAreBitwiseIdentical) {
  const auto data = testing::make_corpus_dir("training_collectives_pinned");
  const TunedRun a = train(data, AlgorithmChoice::kPinned, std::chrono::milliseconds(0));
  const TunedRun b = train(data, AlgorithmChoice::kPinned, std::chrono::milliseconds(2));
  EXPECT_EQ(a.losses, b.losses);
  std::filesystem::remove_all(data);
}

}  // namespace
}  // namespace lattice
