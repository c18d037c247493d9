// The description `lattice explain` prints against what the model really allocates: the
// activation table's total and row count against the arena after a real forward and backward,
// the parameter table against the ParameterStore's buffers, on one rank and on tp ranks with and
// without sequence parallelism, f32 and bf16.
#include "model/model_description.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string>

#include "comm/thread_world.h"
#include "core/philox.h"
#include "core/thread_budget.h"
#include "model/parameters.h"
#include "model/transformer.h"
#include "test_models.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 8;  // 16 token rows: divide by tp 2 and 4 under sp

struct Case {
  const char* model;
  int tp;
  bool sp;
  DType dtype;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " tp" << c.tp << (c.sp ? " sp " : " ") << dtype_name(c.dtype);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = fmt::format("{}_tp{}{}_{}", info.param.model, info.param.tp,
                                 info.param.sp ? "_sp" : "", dtype_name(info.param.dtype));
  return testing::test_case_name(name);
}

Tensor random_tokens(Arena& arena, int64_t vocab, uint64_t key) {
  // kOther: the test's own tensors must not count as the model's activations.
  Tensor t = Tensor::empty(arena, {kB, kT}, DType::kI32, MemoryCategory::kOther);
  PhiloxStream rng(5, key);
  for (int64_t i = 0; i < kB * kT; ++i)
    t.data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(vocab)));
  return t;
}

size_t live(const Arena& arena, MemoryCategory category) {
  return arena.stats().live_by_category[size_t(category)];
}

// What one rank's arena held, measured around a real training micro-batch.
struct Measured {
  size_t parameter_bytes = 0, gradient_bytes = 0, activation_bytes = 0;
  size_t activation_buffers = 0;  // allocations made by the first forward and backward
};

// One micro-batch through every chunk of the model's part: forwards in local order, backwards
// in reverse, as one pipeline rank with one micro-batch in flight. A chunk that a pipeline
// neighbour would feed gets zeros instead.
void run_chunks(Transformer& model, const Tensor& tokens, const Tensor& targets,
                bool defer_weights = false) {
  const int chunks = model.chunk_count();
  const std::vector<LayerChunk>& part = model.registry().part().chunks;
  int64_t counted = 0;
  for (int c = 0; c < chunks; ++c) {
    if (!part[size_t(c)].embedding) model.chunk_input(c, 0, kB, kT).zero_();
    counted += model.forward_chunk(c, 0, tokens, targets).token_count;
  }
  for (int c = chunks - 1; c >= 0; --c) {
    if (!part[size_t(c)].head) model.chunk_output_grad(c, 0, kB, kT).zero_();
    model.backward_chunk(c, 0, float(1.0 / double(std::max<int64_t>(1, counted))), defer_weights);
    if (defer_weights) model.backward_weight_chunk(c, 0);
  }
  model.reduce_partial_grads();
}

struct Options {
  ModelPart part{};
  Recompute recompute = Recompute::kNone;
  bool defer_weights = false;
};

Measured measure(const ModelConfig& config, DType dtype, TensorParallel tp,
                 const Options& options = {}) {
  Arena arena("describe");
  Transformer model(config, arena, dtype, std::move(tp), options.part);
  model.set_recompute(options.recompute);
  model.initialize(11);
  Tensor tokens = random_tokens(arena, config.vocab_size, 1);
  Tensor targets = random_tokens(arena, config.vocab_size, 2);
  Measured m;
  m.parameter_bytes = live(arena, MemoryCategory::kParameters);
  m.gradient_bytes = live(arena, MemoryCategory::kGradients);
  EXPECT_EQ(live(arena, MemoryCategory::kActivations), 0u) << "activations before any forward";
  const size_t before = arena.stats().allocation_count;
  model.parameters().zero_grads();
  run_chunks(model, tokens, targets, options.defer_weights);
  m.activation_bytes = live(arena, MemoryCategory::kActivations);
  m.activation_buffers = arena.stats().allocation_count - before;
  return m;
}

void expect_description_matches(const Case& c, const Measured& m, int rank,
                                const Options& options = {}) {
  const RankWorkload w{testing::test_model(c.model),
                       {c.tp, rank, c.sp},
                       kB,
                       kT,
                       c.dtype,
                       options.part,
                       options.recompute,
                       options.defer_weights};
  const ActivationTable acts = activation_table(w);
  // Exact: the arena's live bytes count what each allocation asked for, not the 64-byte aligned
  // block it got, so alignment rounding does not show here and the tolerance is zero bytes.
  EXPECT_EQ(size_t(acts.total_bytes), m.activation_bytes) << "rank " << rank;
  // One row per buffer: a missing and an extra buffer of the same size would cancel in bytes.
  EXPECT_EQ(acts.rows.size(), m.activation_buffers) << "rank " << rank;
  EXPECT_EQ(acts.slot_bytes + acts.scratch_bytes, acts.total_bytes);
  int64_t sum = 0;
  for (const ActivationRow& row : acts.rows) {
    EXPECT_EQ(row.bytes, row.local_shape.numel() * int64_t(dtype_size(row.dtype))) << row.name;
    EXPECT_LE(row.local_shape.numel(), row.global_shape.numel()) << row.name;
    sum += row.bytes;
  }
  EXPECT_EQ(sum, acts.total_bytes);

  const ParameterTable params = parameter_table(w);
  EXPECT_EQ(size_t(params.parameter_bytes), m.parameter_bytes) << "rank " << rank;
  EXPECT_EQ(size_t(params.gradient_bytes), m.gradient_bytes) << "rank " << rank;
}

class DescriptionMatchesArena : public ::testing::TestWithParam<Case> {};

TEST_P(DescriptionMatchesArena, ActivationAndParameterBytesEqualTheRealModel) {
  const Case c = GetParam();
  const ModelConfig config = testing::test_model(c.model);
  if (c.tp == 1) {
    expect_description_matches(c, measure(config, c.dtype, TensorParallel()), 0);
    return;
  }
  std::vector<Measured> measured(size_t(c.tp));
  run_ranks(c.tp, [&](Communicator& comm) {
    set_thread_budget(1);
    measured[size_t(comm.rank())] = measure(config, c.dtype, TensorParallel(&comm, c.sp));
  });
  for (int r = 0; r < c.tp; ++r) expect_description_matches(c, measured[size_t(r)], r);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DescriptionMatchesArena,
    ::testing::Values(
        Case{"gpt2-tiny", 1, false, DType::kF32}, Case{"gpt2-tiny", 1, false, DType::kBF16},
        Case{"llama-tiny", 1, false, DType::kF32}, Case{"llama-tiny", 1, false, DType::kBF16},
        Case{"gpt2-swiglu-rope", 1, false, DType::kBF16}, Case{"gpt2-tiny", 2, false, DType::kF32},
        Case{"gpt2-tiny", 2, true, DType::kF32}, Case{"gpt2-tiny", 4, true, DType::kBF16},
        Case{"llama-tiny", 2, true, DType::kBF16}, Case{"llama-tiny", 4, false, DType::kF32},
        Case{"llama-kv1-bias", 2, true, DType::kF32}, Case{"mixtral-tiny", 1, false, DType::kF32},
        Case{"mixtral-tiny", 1, false, DType::kBF16}, Case{"mixtral-tiny", 2, true, DType::kBF16}),
    case_name);

// Measures `c` with `options` on its tp ranks and compares every rank with its description.
void expect_matches_with(const Case& c, const Options& options) {
  const ModelConfig config = testing::test_model(c.model);
  std::vector<Measured> measured(size_t(c.tp));
  if (c.tp == 1) {
    measured[0] = measure(config, c.dtype, TensorParallel(), options);
  } else {
    run_ranks(c.tp, [&](Communicator& comm) {
      set_thread_budget(1);
      measured[size_t(comm.rank())] =
          measure(config, c.dtype, TensorParallel(&comm, c.sp), options);
    });
  }
  for (int r = 0; r < c.tp; ++r) expect_description_matches(c, measured[size_t(r)], r, options);
}

// Pipeline stages: the first and last stage of two, and one rank holding two adjacent chunks
// (their shared residual boundary is one buffer), on one rank and on two tp ranks with sp.
TEST(DescriptionMatchesArena, PipelineStagePartsOnOneAndTwoRanks) {
  const ModelPart first{{LayerChunk{0, 1, true, false}}};
  const ModelPart last{{LayerChunk{1, 2, false, true}}};
  const ModelPart two_chunks{{LayerChunk{0, 1, true, false}, LayerChunk{1, 2, false, true}}};
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    for (const ModelPart& part : {first, last, two_chunks}) {
      SCOPED_TRACE(fmt::format("{} with {} chunk(s), first layer {}", model, part.chunks.size(),
                               part.chunks[0].first_layer));
      expect_matches_with({model, 1, false, DType::kBF16}, {.part = part});
      expect_matches_with({model, 2, true, DType::kF32}, {.part = part});
    }
  }
}

// Recompute moves a layer's buffers into one shared set; zero-bubble schedules keep the linear
// maps' output gradients per layer until the weight pass.
TEST(DescriptionMatchesArena, RecomputeAndDeferredWeightGradients) {
  for (const Case& c :
       {Case{"gpt2-tiny", 1, false, DType::kBF16}, Case{"llama-tiny", 2, true, DType::kF32},
        Case{"llama-kv1-bias", 2, false, DType::kBF16}}) {
    for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
      SCOPED_TRACE(fmt::format("{} tp{} recompute {}", c.model, c.tp, recompute_name(r)));
      expect_matches_with(c, {.recompute = r});
    }
    SCOPED_TRACE(fmt::format("{} tp{} deferred weights", c.model, c.tp));
    expect_matches_with(c, {.defer_weights = true});
  }
  const RankWorkload both{model_preset("gpt2-tiny"), {},  kB, kT, DType::kF32, {},
                          Recompute::kFull,          true};
  EXPECT_THROW(activation_table(both), ConfigError);
}

TEST(ParameterTable, TiedCopyOnTheLastStageIsMarkedAndNotCountedTwice) {
  const ModelConfig config = model_preset("gpt2-tiny");  // tied embeddings
  const ModelPart last{{LayerChunk{1, 2, false, true}}};
  const ParameterTable table = parameter_table({config, {}, kB, kT, DType::kF32, last});
  int tied = 0;
  int64_t counted = 0;
  for (const ParameterRow& row : table.rows) {
    const bool copy = row.shard.find("tied copy") != std::string::npos;
    tied += copy ? 1 : 0;
    if (copy) {
      EXPECT_EQ(row.name, "transformer.wte.weight");
    }
    counted += copy ? 0 : row.global_shape.numel();
  }
  EXPECT_EQ(tied, 1);
  EXPECT_EQ(table.global_elements, counted);
}

TEST(ParameterTable, RowsFollowTheRegistryWithShardsAndPartialGrads) {
  const ModelConfig config = model_preset("gpt2-tiny");
  const RankWorkload w{config, {2, 1, true}, kB, kT, DType::kBF16};
  const ParameterTable table = parameter_table(w);
  const ParameterRegistry registry(config, w.tp);
  ASSERT_EQ(table.rows.size(), registry.specs().size());
  EXPECT_EQ(table.global_elements, registry.global_elements());
  EXPECT_EQ(table.store_elements, registry.total_elements());
  int64_t partial = 0;
  for (size_t i = 0; i < table.rows.size(); ++i) {
    const ParameterSpec& spec = registry.at(int(i));
    const ParameterRow& row = table.rows[i];
    EXPECT_EQ(row.name, spec.name);
    EXPECT_EQ(row.global_shape, spec.shape);
    EXPECT_EQ(row.local_shape, spec.local_shape);
    EXPECT_EQ(row.bytes, spec.local_shape.numel() * 6) << "f32 master + bf16 copy";
    EXPECT_EQ(row.dtype, "f32 master + bf16 compute");
    const bool says_partial = row.shard.find("partial grad: summed over tp") != std::string::npos;
    EXPECT_EQ(says_partial, spec.partial_grad) << row.name;
    partial += spec.partial_grad ? spec.local_shape.numel() : 0;
  }
  EXPECT_GT(partial, 0);  // sp: norms and row-parallel biases
  EXPECT_EQ(table.partial_grad_elements, partial);
  // Rank 1 of 2 holds the second half of each head group of the fused c_attn, and the vocabulary
  // rows [128, 256).
  const ParameterRow& attn =
      table.rows[size_t(registry.find("transformer.h.0.attn.c_attn.weight"))];
  EXPECT_EQ(attn.shard, "dim 1 [32, 64) + [96, 128) + [160, 192)");
  EXPECT_EQ(attn.local_shape, (Shape{64, 96}));
  EXPECT_EQ(table.rows[size_t(registry.find("transformer.wte.weight"))].shard, "dim 0 [128, 256)");
  // ZeRO: the caller's share of the optimizer state.
  EXPECT_EQ(table.optimizer_bytes, 8 * table.store_elements);
  EXPECT_EQ(parameter_table(w, 1000).optimizer_bytes, 8000);
}

TEST(ActivationTable, SequenceParallelSplitsTheResidualRowsOnly) {
  const ModelConfig config = model_preset("gpt2-tiny");
  const ActivationTable plain = activation_table({config, {4, 0, false}, kB, kT, DType::kF32});
  const ActivationTable sp = activation_table({config, {4, 0, true}, kB, kT, DType::kF32});
  auto find = [](const ActivationTable& t, const std::string& name) {
    for (const ActivationRow& row : t.rows) {
      if (row.name == name) return row;
    }
    ADD_FAILURE() << "no activation " << name;
    return ActivationRow{};
  };
  EXPECT_EQ(find(plain, "residual 0").local_shape, (Shape{16, 64}));
  EXPECT_EQ(find(sp, "residual 0").local_shape, (Shape{4, 64}));
  EXPECT_EQ(find(sp, "residual 0").split, "token rows (sp)");
  EXPECT_EQ(find(sp, "layer 1 ln_1 (gathered)").local_shape, (Shape{16, 64}));
  EXPECT_EQ(find(sp, "layer 0 qkv").local_shape, (Shape{16, 3 * 16}));
  EXPECT_EQ(find(sp, "layer 0 qkv").split, "heads");
  EXPECT_EQ(find(sp, "layer 0 mlp up").local_shape, (Shape{16, 64}));
  EXPECT_EQ(find(sp, "logits").local_shape, (Shape{16, 64}));  // 256 / 4 classes per rank
  EXPECT_EQ(find(sp, "logits").split, "vocab");
}

// GPT-2's attention reads q, k and v in the fused projection's output: no split copies and no
// gradients of their own, unless the ring of context parallelism (or RoPE) needs them apart.
TEST(ActivationTable, Gpt2KeepsQkvSplitOnlyUnderContextParallelismOrRope) {
  auto names = [](const ActivationTable& t) {
    std::set<std::string> out;
    for (const ActivationRow& row : t.rows) out.insert(row.name);
    return out;
  };
  const ModelConfig gpt2 = model_preset("gpt2-tiny");
  RankWorkload w{gpt2, {}, kB, kT, DType::kF32};
  const std::set<std::string> in_place = names(activation_table(w));
  EXPECT_TRUE(in_place.contains("layer 0 qkv"));
  for (const char* split : {"layer 0 q", "layer 0 k", "layer 0 v", "grad q", "grad k", "grad v"}) {
    EXPECT_FALSE(in_place.contains(split)) << split;
  }
  EXPECT_TRUE(in_place.contains("grad qkv"));
  w.context_parallel = true;
  const std::set<std::string> ring = names(activation_table(w));
  for (const char* split : {"layer 0 q", "layer 0 k", "layer 0 v", "grad q", "grad k", "grad v"}) {
    EXPECT_TRUE(ring.contains(split)) << split;
  }
  const std::set<std::string> rope =
      names(activation_table({testing::test_model("gpt2-swiglu-rope"), {}, kB, kT, DType::kF32}));
  EXPECT_TRUE(rope.contains("layer 0 q"));
  EXPECT_TRUE(rope.contains("grad q (before rope)"));
}

TEST(ModelDescription, LayoutsTheModelCannotTakeAreConfigErrors) {
  const ModelConfig gpt2 = model_preset("gpt2-tiny");
  EXPECT_THROW(parameter_table({gpt2, {3, 0, false}, kB, kT, DType::kF32}), ConfigError);
  EXPECT_THROW(activation_table({gpt2, {3, 0, false}, kB, kT, DType::kF32}), ConfigError);
  // 2 × 3 = 6 token rows do not split over 4 ranks.
  EXPECT_THROW(tensor_parallel_collectives({gpt2, {4, 0, true}, 2, 3, DType::kF32}), ConfigError);
  EXPECT_THROW(activation_table({gpt2, {1, 0, false}, 1, gpt2.seq_len + 1, DType::kF32}),
               ConfigError);
  EXPECT_THROW(parameter_table({gpt2, {1, 0, false}, kB, kT, DType::kF16}), DTypeError);
}

TEST(ModelDescription, Gpt2SmallIsDescribedFromShapesAlone) {
  // 124M parameters at tp 4 with sp, B=4, T=1024: nothing is allocated (no arena exists here),
  // so `lattice explain` on it is instant.
  const RankWorkload w{model_preset("gpt2-124m"), {4, 3, true}, 4, 1024, DType::kBF16};
  const ParameterTable params = parameter_table(w);
  EXPECT_EQ(params.global_elements, 124439808);
  EXPECT_EQ(params.parameter_bytes, params.store_elements * 6);  // f32 master + bf16 copy
  const ActivationTable acts = activation_table(w);
  int checked = 0;
  for (const ActivationRow& row : acts.rows) {
    if (row.name == "residual 12") {
      EXPECT_EQ(row.local_shape, (Shape{1024, 768}));  // 4096 token rows / 4
      ++checked;
    } else if (row.name == "logits") {
      EXPECT_EQ(row.local_shape, (Shape{4096, 12565}));  // ⌈50257 / 4⌉ classes
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2);
  const std::vector<CollectiveRecord> collectives = tensor_parallel_collectives(w);
  // Forward: embedding, 4 per layer, ln_f, 2 for the loss; backward: ln_f, 4 per layer,
  // embedding; once per step: the partial gradients.
  EXPECT_EQ(collectives.size(), size_t((1 + 48 + 1 + 2) + (1 + 48 + 1) + 1));
}

// The parameter store of a dp rank at each ZeRO stage, built without a group (its sizes depend
// on the stage and the rank only): its bytes equal the table's, so `lattice explain --zero`
// tells what a run will hold.
TEST(ParameterTable, ZeroStagesMatchTheStoreOfEachRank) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    const ModelConfig config = testing::test_model(model);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int stage = 0; stage <= 3; ++stage) {
        for (int ranks : {2, 3}) {
          for (int rank = 0; rank < ranks; ++rank) {
            const ZeroSharding zero{stage, ranks, rank};
            Arena arena("zero");
            Transformer transformer(config, arena, dtype, TensorParallel(), {}, zero);
            const ParameterTable table = parameter_table({config, {}, kB, kT, dtype}, zero);
            const std::string where = fmt::format("{} {} zero {} rank {} of {}", model,
                                                  dtype_name(dtype), stage, rank, ranks);
            EXPECT_EQ(size_t(table.parameter_bytes), live(arena, MemoryCategory::kParameters))
                << where;
            EXPECT_EQ(size_t(table.gradient_bytes), live(arena, MemoryCategory::kGradients))
                << where;
            const FlatRange owned = zero.owned(table.store_elements);
            EXPECT_EQ(table.optimizer_elements, owned.size()) << where;
            if (stage >= 1) {
              EXPECT_LT(table.optimizer_elements, table.store_elements) << where;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace lattice
