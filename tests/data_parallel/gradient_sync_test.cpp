// The data-parallel seam (data_parallel/gradient_sync.h): each ZeRO stage's synchroniser behind
// one interface, the bucketed all-reduce of ZeRO-0/1 summing exactly whether a bucket launched
// during backward or at finish, and a trainer continuing on a new dp group without rebuilding
// its model bitwise as the uninterrupted run.
#include <gtest/gtest.h>

#include <mutex>

#include "../train/test_corpus.h"
#include "comm/thread_world.h"
#include "data_parallel/grad_reducer.h"
#include "data_parallel/gradient_sync.h"
#include "data_parallel/sharded_gradients.h"
#include "model/config.h"
#include "train/trainer.h"

namespace lattice {
namespace {

ModelConfig tiny_model() {
  ModelConfig model = model_preset("gpt2-tiny");
  model.seq_len = 16;
  return model;
}

class GradReducerTest : public ::testing::TestWithParam<int> {};

// Small integers per (rank, index): sums are exact, so the result is compared bitwise.
TEST_P(GradReducerTest, SumsEveryBucketWhetherLaunchedEarlyOrAtFinish) {
  const int n = GetParam();
  const ModelConfig model = tiny_model();
  run_ranks(n, [&](Communicator& comm) {
    Arena arena("r");
    const ParameterRegistry registry(model);
    ParameterStore store(registry, arena, DType::kF32, ZeroSharding{0, n, comm.rank()});
    const int params = int(registry.specs().size());
    const int64_t P = registry.total_elements();
    GradReducer reducer(comm, store, {.bucket_bytes = 16 << 10});
    ASSERT_GT(reducer.buckets().size(), 2u);
    float* grads = store.grads().data<float>();
    for (int step = 0; step < 2; ++step) {
      for (int64_t i = 0; i < P; ++i) grads[i] = float((comm.rank() + 1) * (i % 13) + step);
      reducer.begin_step();
      // An earlier micro-batch's backward: its gradients accumulate, nothing is launched.
      reducer.begin_backward(false);
      for (int p = params - 1; p >= 0; --p) reducer.param_ready(p);
      EXPECT_EQ(reducer.stats().launched_during_backward, 0);
      // The last one, in backward order; step 1 reports only half, finish() does the rest.
      reducer.begin_backward(true);
      const int reported = step == 0 ? params : params / 2;
      for (int p = params - 1; p >= params - reported; --p) reducer.param_ready(p);
      reducer.end_backward();
      reducer.finish();
      if (step == 0) {
        EXPECT_EQ(reducer.stats().launched_during_backward, int(reducer.buckets().size()));
      } else {
        EXPECT_LT(reducer.stats().launched_during_backward, int(reducer.buckets().size()));
      }
      const float rank_sum = float(n * (n + 1) / 2);
      for (int64_t i = 0; i < P; ++i) {
        ASSERT_EQ(grads[i], rank_sum * float(i % 13) + float(n * step)) << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GradReducerTest, ::testing::Values(1, 2, 3, 4));

// One seam, one implementation per design: which one a stage gets, and what it counts in the
// gradient norm (each element on exactly one rank under ZeRO >= 1).
TEST(GradientSync, EachZeroStageGetsItsDesign) {
  const ModelConfig model = tiny_model();
  run_ranks(2, [&](Communicator& comm) {
    const ParameterRegistry registry(model);
    const int64_t P = registry.total_elements();
    for (int zero = 0; zero <= 3; ++zero) {
      Arena arena("r");
      ParameterStore store(registry, arena, DType::kF32, ZeroSharding{zero, 2, comm.rank()});
      std::unique_ptr<GradientSync> sync = make_gradient_sync(&comm, store, arena);
      if (zero < 2) {
        EXPECT_NE(dynamic_cast<GradReducer*>(sync.get()), nullptr) << zero;
        EXPECT_EQ(sync->parameter_hooks(), nullptr) << zero;
      } else {
        EXPECT_NE(dynamic_cast<ShardedGradients*>(sync.get()), nullptr) << zero;
        EXPECT_NE(sync->parameter_hooks(), nullptr) << zero;
      }
      const FlatRange counted = sync->counted_range();
      const FlatRange shard = zero_shard(P, 2, comm.rank());
      EXPECT_EQ(counted.begin, zero == 0 ? 0 : shard.begin) << zero;
      EXPECT_EQ(counted.end, zero == 0 ? P : shard.end) << zero;
      // Partial sums add over the group exactly when each rank counts a disjoint shard.
      EXPECT_EQ(sync->sum_counted(1.0), zero == 0 ? 1.0 : 2.0) << zero;
      EXPECT_EQ(sync->stats().zero, zero);
    }
    Arena arena("r");
    ParameterStore alone(registry, arena, DType::kF32);
    std::unique_ptr<GradientSync> local = make_gradient_sync(nullptr, alone, arena);
    EXPECT_NE(dynamic_cast<LocalGradients*>(local.get()), nullptr);
    EXPECT_EQ(local->stats().buckets, 0);
  });
}

TrainConfig small_config(const std::filesystem::path& data) {
  TrainConfig c;
  c.model = tiny_model();
  c.data_dir = data.string();
  c.data_mode = SamplingMode::kShuffled;
  c.seq_len = 16;
  c.global_batch = 8;
  c.micro_batches = 2;
  c.micro_batch = 0;
  c.lr = 3e-3f;
  c.adam.lr = c.lr;
  c.warmup_steps = 1;
  c.steps = c.decay_steps = 4;
  c.threads = 1;
  return c;
}

// What an elastic generation that replaced a rank needs: the trainers carry on over a new dp
// group (the same ranks in the same places), keeping their model and optimizer state, and the
// run is the uninterrupted one bit for bit.
TEST(GradientSync, ATrainerContinuesOnANewGroupAsTheUninterruptedRun) {
  const auto dir = testing::make_corpus_dir("gradient_sync_rejoin");
  const TrainConfig config = small_config(dir);
  for (int zero = 0; zero <= 3; ++zero) {
    std::vector<double> uninterrupted, rejoined;
    std::mutex mutex;
    for (bool rejoin : {false, true}) {
      run_ranks(2, [&](Communicator& comm) {
        Arena arena(fmt::format("rank{}", comm.rank()));
        ParallelSetup setup{.dp = &comm,
                            .zero = zero,
                            .bucket_bytes = 16 << 10,
                            .check_replicas = true,
                            .threads = 1};
        Trainer trainer(config, arena, setup);
        std::vector<double> losses;
        losses.push_back(trainer.train_step().loss);
        losses.push_back(trainer.train_step().loss);
        // A group of its own (its own name and sequence numbers), the same members.
        Communicator next = comm.split(0, comm.rank());
        if (rejoin) trainer.rejoin_data_parallel(next);
        losses.push_back(trainer.train_step().loss);
        losses.push_back(trainer.train_step().loss);
        // The gradients of steps 3 and 4 went over the new group only when the trainer rejoined
        // it (ZeRO-0/1 all-reduce them, ZeRO-2/3 reduce them to their owners).
        const Collective reduction = zero < 2 ? Collective::kAllReduce : Collective::kReduce;
        EXPECT_EQ(next.stats().totals(reduction).calls > 0, rejoin) << "zero " << zero;
        std::lock_guard lock(mutex);
        if (comm.rank() == 0) (rejoin ? rejoined : uninterrupted) = losses;
      });
    }
    ASSERT_EQ(rejoined.size(), 4u);
    for (size_t i = 0; i < rejoined.size(); ++i) {
      EXPECT_EQ(rejoined[i], uninterrupted[i]) << "zero " << zero << " step " << i;
    }
  }
}

TEST(GradientSync, RejoiningAGroupOfAnotherSizeIsAConfigError) {
  const auto dir = testing::make_corpus_dir("gradient_sync_rejoin_size");
  const TrainConfig config = small_config(dir);
  run_ranks(2, [&](Communicator& comm) {
    Arena arena(fmt::format("rank{}", comm.rank()));
    Trainer trainer(config, arena, {.dp = &comm, .zero = 1, .threads = 1});
    Communicator alone = comm.split(comm.rank(), 0);  // a group of one
    try {
      trainer.rejoin_data_parallel(alone);
      ADD_FAILURE() << "a group of one accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 of 1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("restores the trainer from a snapshot"),
                std::string::npos)
          << e.what();
    }
    trainer.train_step();  // the old group still works
  });
}

}  // namespace
}  // namespace lattice
