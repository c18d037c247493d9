// TensorParallel::stats(): every collective that communicates is counted (calls, bytes of the
// full buffer, wall time inside the call), a group of one counts nothing, reset_stats() starts
// over, and a transformer step counts exactly the collectives it logs.
#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "comm/thread_world.h"
#include "core/arena.h"
#include "core/philox.h"
#include "core/thread_budget.h"
#include "core/timer.h"
#include "model/transformer.h"
#include "parallel/tensor_parallel.h"

namespace lattice {
namespace {

Tensor filled(Arena& arena, Shape shape, DType dtype, float first) {
  Tensor t = Tensor::empty(arena, shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = first + float(i);  // small integers: exact in f32 and bf16
    if (dtype == DType::kF32) {
      t.data<float>()[i] = v;
    } else {
      t.data<bf16>()[i] = bf16(v);
    }
  }
  return t;
}

struct RankOutcome {
  TensorParallelStats after_calls;
  TensorParallelStats after_reset;
  double outer_seconds = 0;  // wall time around the four calls
  std::vector<float> reduced, gathered, scattered;
};

TEST(TensorParallelStats, CountsCallsBytesAndTimeOfEveryCollectiveOnTwoRanks) {
  constexpr int kRanks = 2;
  std::vector<RankOutcome> outcomes(kRanks);
  run_ranks(kRanks, [&](Communicator& comm) {
    Arena arena(fmt::format("stats-rank{}", comm.rank()));
    TensorParallel tp(&comm, /*sequence_parallel=*/false);
    const float base = float(10 * comm.rank());
    Tensor partial = filled(arena, {6}, DType::kF32, base);    // 24 bytes
    Tensor maxima = filled(arena, {3}, DType::kF32, base);     // 12 bytes
    Tensor shard = filled(arena, {2, 3}, DType::kBF16, base);  // gathered: 4×3 bf16, 24 bytes
    Tensor full = Tensor::empty(arena, {4, 3}, DType::kBF16);
    Tensor to_scatter = filled(arena, {4, 2}, DType::kF32, base);  // 32 bytes
    Tensor scattered = Tensor::empty(arena, {2, 2}, DType::kF32);

    RankOutcome& out = outcomes[size_t(comm.rank())];
    const Stopwatch outer;
    tp.all_reduce(partial, "partial");
    tp.all_reduce_max(maxima, "maxima");
    tp.all_gather_rows(full, shard, "rows");
    tp.reduce_scatter_rows(scattered, to_scatter, "rows");
    out.outer_seconds = outer.seconds();
    out.after_calls = tp.stats();
    tp.reset_stats();
    out.after_reset = tp.stats();

    out.reduced.assign(partial.data<float>(), partial.data<float>() + 6);
    for (int64_t i = 0; i < 12; ++i) out.gathered.push_back(float(full.data<bf16>()[i]));
    out.scattered.assign(scattered.data<float>(), scattered.data<float>() + 4);
  });

  for (int rank = 0; rank < kRanks; ++rank) {
    const RankOutcome& out = outcomes[size_t(rank)];
    EXPECT_EQ(out.after_calls.calls, 4) << "rank " << rank;
    EXPECT_EQ(out.after_calls.bytes, 24 + 12 + 24 + 32) << "rank " << rank;
    // On 2 ranks each rank sends the whole buffer of an all-reduce, half of the others'.
    EXPECT_EQ(out.after_calls.bus_bytes, 24 + 12 + 24 / 2 + 32 / 2) << "rank " << rank;
    // Seconds, not milliseconds, and only the time inside the calls.
    EXPECT_GT(out.after_calls.seconds, 0.0) << "rank " << rank;
    EXPECT_LE(out.after_calls.seconds, out.outer_seconds) << "rank " << rank;
    EXPECT_EQ(out.after_reset.calls, 0);
    EXPECT_EQ(out.after_reset.bytes, 0);
    EXPECT_EQ(out.after_reset.bus_bytes, 0.0);
    EXPECT_EQ(out.after_reset.seconds, 0.0);
    // The counted calls did their work: rank 0 holds 0.., rank 1 holds 10..
    for (int i = 0; i < 6; ++i) EXPECT_EQ(out.reduced[size_t(i)], float(10 + 2 * i));
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(out.gathered[size_t(i)], float(i));
      EXPECT_EQ(out.gathered[size_t(6 + i)], float(10 + i));
    }
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.scattered[size_t(i)], float(10 + 2 * (4 * rank + i)));
  }
}

TEST(TensorParallelStats, AGroupOfOneCountsNothing) {
  Arena arena("stats-one");
  for (TensorParallel tp : {TensorParallel(), TensorParallel(nullptr, true)}) {
    Tensor partial = filled(arena, {4}, DType::kF32, 1.0f);
    Tensor full = Tensor::empty(arena, {2, 2}, DType::kF32);
    tp.all_reduce(partial, "partial");
    tp.all_reduce_max(partial, "partial");
    tp.all_gather_rows(full, partial.view({2, 2}), "rows");
    tp.reduce_scatter_rows(partial, full.view({4}), "rows");
    EXPECT_EQ(tp.stats().calls, 0);
    EXPECT_EQ(tp.stats().bytes, 0);
    EXPECT_EQ(tp.stats().bus_bytes, 0.0);
    EXPECT_EQ(tp.comm_seconds(), 0.0);
    EXPECT_EQ(full.data<float>()[3], 4.0f);  // the copy of a group of one still happened
  }
}

// A training step's collectives as the model logs them (lattice explain's list) and as the
// stats count them must agree: every call of forward, backward and reduce_partial_grads counts.
class TransformerStepStats : public ::testing::TestWithParam<bool> {};

TEST_P(TransformerStepStats, CountsEveryLoggedCollectiveOfAStep) {
  const bool sp = GetParam();
  ModelConfig config = model_preset("gpt2-tiny");
  config.seq_len = 8;
  std::mutex mutex;
  std::vector<TensorParallelStats> stats(2);
  std::vector<int64_t> logged_calls(2), logged_bytes(2);
  run_ranks(2, [&](Communicator& comm) {
    set_thread_budget(1);
    Arena arena(fmt::format("step-rank{}", comm.rank()));
    Transformer model(config, arena, DType::kF32, TensorParallel(&comm, sp));
    model.initialize(3);
    Tensor tokens = Tensor::empty(arena, {2, 8}, DType::kI32);
    Tensor targets = Tensor::empty(arena, {2, 8}, DType::kI32);
    PhiloxStream rng(5, 6);
    for (Tensor* t : {&tokens, &targets}) {
      for (int64_t i = 0; i < t->numel(); ++i)
        t->data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(config.vocab_size)));
    }
    TensorParallel& tp = model.tensor_parallel();
    tp.set_logging(true);
    model.parameters().zero_grads();
    model.forward(tokens, targets);
    model.backward(1.0f / 16);
    model.reduce_partial_grads();
    int64_t bytes = 0;
    for (const CollectiveRecord& r : tp.log()) bytes += r.elements * int64_t(dtype_size(r.dtype));
    const std::lock_guard<std::mutex> lock(mutex);
    stats[size_t(comm.rank())] = tp.stats();
    logged_calls[size_t(comm.rank())] = int64_t(tp.log().size());
    logged_bytes[size_t(comm.rank())] = bytes;
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_GT(logged_calls[size_t(rank)], 2 * config.n_layer);  // at least two per layer
    EXPECT_EQ(stats[size_t(rank)].calls, logged_calls[size_t(rank)]) << "rank " << rank;
    EXPECT_EQ(stats[size_t(rank)].bytes, logged_bytes[size_t(rank)]) << "rank " << rank;
    EXPECT_GT(stats[size_t(rank)].seconds, 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, TransformerStepStats, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "sp" : "no_sp");
                         });

}  // namespace
}  // namespace lattice
