// `lattice explain` predicts the tensor-parallel collectives of a step without running anything
// (model/model_description.h). Here the real model runs on tp in-process ranks with the group's
// log on, and every rank's recorded list must equal the prediction record for record: op, what,
// elements and dtype, in order. That equality is what makes the printed data flow trustworthy.
#include <gtest/gtest.h>

#include <algorithm>

#include "../model/test_models.h"
#include "comm/thread_world.h"
#include "core/philox.h"
#include "core/thread_budget.h"
#include "model/model_description.h"
#include "model/transformer.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 8;  // 16 token rows: divide by tp 2 and 4 under sp

struct Layout {
  const char* model;
  int tp;
  bool sp;
  DType dtype;
};

void PrintTo(const Layout& l, std::ostream* os) {
  *os << l.model << " tp" << l.tp << (l.sp ? " sp " : " ") << dtype_name(l.dtype);
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& info) {
  std::string name = fmt::format("{}_tp{}{}_{}", info.param.model, info.param.tp,
                                 info.param.sp ? "_sp" : "", dtype_name(info.param.dtype));
  return testing::test_case_name(name);
}

Tensor random_tokens(Arena& arena, int64_t vocab, uint64_t key) {
  Tensor t = Tensor::empty(arena, {kB, kT}, DType::kI32);
  PhiloxStream rng(3, key);
  for (int64_t i = 0; i < kB * kT; ++i)
    t.data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(vocab)));
  return t;
}

// One forward and one backward of every chunk the rank holds (forwards in local order,
// backwards in reverse; for the whole model: forward(), backward()) and the partial-gradient
// reduction, with the group's log on. A chunk a pipeline neighbour would feed gets zeros.
std::vector<CollectiveRecord> recorded_step(const ModelConfig& config, DType dtype,
                                            TensorParallel tp, const ModelPart& part = {},
                                            Recompute recompute = Recompute::kNone) {
  Arena arena("explain");
  Transformer model(config, arena, dtype, std::move(tp), part);
  model.set_recompute(recompute);
  model.initialize(21);
  Tensor tokens = random_tokens(arena, config.vocab_size, 1);
  Tensor targets = random_tokens(arena, config.vocab_size, 2);
  model.tensor_parallel().set_logging(true);
  model.parameters().zero_grads();
  const std::vector<LayerChunk>& chunks = model.registry().part().chunks;
  if (part.chunks.empty()) {
    ForwardResult r = model.forward(tokens, targets);
    model.backward(float(1.0 / double(r.token_count)));
  } else {
    for (int c = 0; c < model.chunk_count(); ++c) {
      if (!chunks[size_t(c)].embedding) model.chunk_input(c, 0, kB, kT).zero_();
      model.forward_chunk(c, 0, tokens, targets);
    }
    for (int c = model.chunk_count() - 1; c >= 0; --c) {
      if (!chunks[size_t(c)].head) model.chunk_output_grad(c, 0, kB, kT).zero_();
      model.backward_chunk(c, 0, 1.0f / float(kB * kT));
    }
  }
  model.reduce_partial_grads();
  return model.tensor_parallel().log();
}

void expect_same_records(const std::vector<CollectiveRecord>& recorded,
                         const std::vector<CollectiveRecord>& predicted, int rank) {
  const size_t n = std::min(recorded.size(), predicted.size());
  for (size_t i = 0; i < n; ++i) {
    const CollectiveRecord& got = recorded[i];
    const CollectiveRecord& want = predicted[i];
    ASSERT_TRUE(got.op == want.op && got.what == want.what && got.elements == want.elements &&
                got.dtype == want.dtype)
        << "rank " << rank << " collective " << i << ": recorded " << got.op << " '" << got.what
        << "' " << got.elements << " " << dtype_name(got.dtype) << ", predicted " << want.op << " '"
        << want.what << "' " << want.elements << " " << dtype_name(want.dtype);
  }
  ASSERT_EQ(recorded.size(), predicted.size())
      << "rank " << rank << ": first unmatched "
      << (recorded.size() > n ? "recorded '" + recorded[n].what + "'"
                              : "predicted '" + predicted[n].what + "'");
}

class ExplainCollectives : public ::testing::TestWithParam<Layout> {};

TEST_P(ExplainCollectives, RecordedLogEqualsThePredictedList) {
  const Layout l = GetParam();
  const ModelConfig config = testing::test_model(l.model);
  std::vector<std::vector<CollectiveRecord>> logs(size_t(l.tp));
  if (l.tp == 1) {
    logs[0] = recorded_step(config, l.dtype, TensorParallel());
  } else {
    run_ranks(l.tp, [&](Communicator& comm) {
      set_thread_budget(1);
      logs[size_t(comm.rank())] = recorded_step(config, l.dtype, TensorParallel(&comm, l.sp));
    });
  }
  for (int rank = 0; rank < l.tp; ++rank) {
    const std::vector<CollectiveRecord> predicted =
        tensor_parallel_collectives({config, {l.tp, rank, l.sp}, kB, kT, l.dtype});
    ASSERT_FALSE(predicted.empty());
    expect_same_records(logs[size_t(rank)], predicted, rank);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExplainCollectives,
                         ::testing::Values(Layout{"gpt2-tiny", 1, false, DType::kF32},
                                           Layout{"gpt2-tiny", 2, false, DType::kF32},
                                           Layout{"gpt2-tiny", 2, true, DType::kF32},
                                           Layout{"gpt2-tiny", 4, false, DType::kF32},
                                           Layout{"gpt2-tiny", 4, true, DType::kF32},
                                           Layout{"gpt2-tiny", 2, true, DType::kBF16},
                                           Layout{"llama-tiny", 2, false, DType::kF32},
                                           Layout{"llama-tiny", 2, true, DType::kF32},
                                           Layout{"llama-tiny", 4, false, DType::kF32},
                                           Layout{"llama-tiny", 4, true, DType::kF32},
                                           Layout{"llama-tiny", 4, true, DType::kBF16},
                                           Layout{"llama-kv1-bias", 2, false, DType::kF32},
                                           Layout{"llama-kv1-bias", 2, true, DType::kF32}),
                         layout_name);

// A pipeline rank's chunks issue their part of the list: the first stage without the loss, the
// last without the embedding, two chunks on one rank each in turn.
TEST(ExplainCollectives, PipelineStagePartsRecordTheirShareOfTheList) {
  const std::vector<ModelPart> parts = {
      {{LayerChunk{0, 1, true, false}}},
      {{LayerChunk{1, 2, false, true}}},
      {{LayerChunk{0, 1, true, false}, LayerChunk{1, 2, false, true}}},
  };
  for (const char* name : {"gpt2-tiny", "llama-kv1-bias"}) {
    const ModelConfig config = testing::test_model(name);
    for (const ModelPart& part : parts) {
      for (bool sp : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} chunk(s) from layer {}{}", name, part.chunks.size(),
                                 part.chunks[0].first_layer, sp ? " sp" : ""));
        std::vector<std::vector<CollectiveRecord>> logs(2);
        run_ranks(2, [&](Communicator& comm) {
          set_thread_budget(1);
          logs[size_t(comm.rank())] =
              recorded_step(config, DType::kF32, TensorParallel(&comm, sp), part);
        });
        for (int rank = 0; rank < 2; ++rank) {
          expect_same_records(
              logs[size_t(rank)],
              tensor_parallel_collectives({config, {2, rank, sp}, kB, kT, DType::kF32, part}),
              rank);
        }
      }
    }
  }
}

// Full recompute runs each layer's forward again before its backward, collectives included
// (issue 7 item 4); selective recompute adds none.
TEST(ExplainCollectives, RecomputeRepeatsTheLayerForwardCollectives) {
  for (Recompute recompute : {Recompute::kSelective, Recompute::kFull}) {
    for (bool sp : {false, true}) {
      SCOPED_TRACE(fmt::format("recompute {}{}", recompute_name(recompute), sp ? " sp" : ""));
      const ModelConfig config = testing::test_model("llama-kv1-bias");
      std::vector<std::vector<CollectiveRecord>> logs(2);
      run_ranks(2, [&](Communicator& comm) {
        set_thread_budget(1);
        logs[size_t(comm.rank())] =
            recorded_step(config, DType::kBF16, TensorParallel(&comm, sp), {}, recompute);
      });
      for (int rank = 0; rank < 2; ++rank) {
        const RankWorkload w{config, {2, rank, sp}, kB, kT, DType::kBF16, {}, recompute};
        expect_same_records(logs[size_t(rank)], tensor_parallel_collectives(w), rank);
      }
      const RankWorkload plain{config, {2, 0, sp}, kB, kT, DType::kBF16};
      const size_t extra = recompute == Recompute::kFull ? size_t(4 * config.n_layer) : 0;
      EXPECT_EQ(logs[0].size(),
                tensor_parallel_collectives(plain).size() + (sp ? extra : extra / 2));
    }
  }
}

// The prediction is what the op sequence says it is: the Megatron pair per block (all-reduce
// without sp; all-gather + reduce-scatter with sp, the same bytes), partials only when some
// replicated parameter is computed in part.
TEST(ExplainCollectives, SequenceParallelTradesEachAllReduceForAGatherAndAScatter) {
  const ModelConfig config = model_preset("gpt2-tiny");
  auto count = [](const std::vector<CollectiveRecord>& records, const std::string& op) {
    return std::count_if(records.begin(), records.end(),
                         [&](const CollectiveRecord& r) { return r.op == op; });
  };
  const auto plain = tensor_parallel_collectives({config, {2, 0, false}, kB, kT, DType::kF32});
  const auto sp = tensor_parallel_collectives({config, {2, 0, true}, kB, kT, DType::kF32});
  const int64_t L = config.n_layer;
  // Without sp: embedding, 2 per layer, ln_f (bwd), 2 per layer backward, the loss' Σexp.
  EXPECT_EQ(count(plain, "all_reduce"), 1 + 2 * L + 1 + 2 * L + 1);
  EXPECT_EQ(count(plain, "all_reduce_max"), 1);
  EXPECT_EQ(count(plain, "all_gather"), 0);
  EXPECT_EQ(plain.back().what, "layer 0 ln_1 (bwd)");  // gpt2 without sp: no partial grads
  EXPECT_EQ(count(sp, "reduce_scatter"), 1 + 2 * L + 1 + 2 * L);
  EXPECT_EQ(count(sp, "all_gather"), 2 * L + 1 + 2 * L + 1);
  EXPECT_EQ(sp.back().what, "replicated parameters' gradients");
  for (const CollectiveRecord& r : sp) {
    if (r.op == "all_gather" || r.op == "reduce_scatter") {
      EXPECT_EQ(r.elements, kB * kT * config.d_model) << r.what;
    }
  }
}

}  // namespace
}  // namespace lattice
