#include "train/train_config.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace lattice {
namespace {

std::string error_of(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_train_config(toml, "test.toml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfig, ReadsEverySectionAndAppliesOverridesInOrder) {
  TrainConfig c =
      parse_train_config(R"(
[model]
preset = "llama-tiny"
n_layer = 3
[batch]
micro_batch = 4
micro_batches = 2
[optim]
lr = 3e-4
[train]
steps = 7
precision = "bf16"
)",
                         "test.toml", {"optim.lr=1e-3", "model.d_ff=64", "train.precision=fp32"});
  EXPECT_EQ(c.model.name, "llama-tiny");
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.d_ff, 64);
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_FLOAT_EQ(c.lr, 1e-3f);
  EXPECT_EQ(c.compute_dtype, DType::kF32);
  EXPECT_EQ(c.steps, 7);
  EXPECT_EQ(c.decay_steps, 7);
  EXPECT_EQ(c.seq_len, 64);
  c.resolve_batch();
  EXPECT_EQ(c.global_batch, 8);
}

TEST(TrainConfig, UnknownKeySuggestsTheNearestValidKey) {
  std::string e = error_of("[optim]\nlearning_rate = 1e-3\n");
  EXPECT_NE(e.find("optim.learning_rate"), std::string::npos) << e;
  e = error_of("[optim]\nwarmup_step = 10\n");
  EXPECT_NE(e.find("did you mean 'optim.warmup_steps'"), std::string::npos) << e;
  e = error_of("[train]\nlr = 1e-3\n");
  EXPECT_NE(e.find("did you mean 'optim.lr'"), std::string::npos) << e;
  e = error_of("[optim]\nlearning_rate = 1e-3\n");
  EXPECT_NE(e.find("did you mean 'optim.lr'"), std::string::npos) << e;  // nanoGPT's name
  e = error_of("[batch]\nblock_size = 64\n");
  EXPECT_NE(e.find("did you mean 'batch.seq_len'"), std::string::npos) << e;
  e = error_of("", {"model.n_layers=3"});
  EXPECT_NE(e.find("did you mean 'model.n_layer'"), std::string::npos) << e;
}

TEST(TrainConfig, BadValuesNameTheKey) {
  EXPECT_NE(error_of("[train]\nsteps = \"many\"\n").find("'train.steps'"), std::string::npos);
  EXPECT_NE(error_of("[train]\nsteps = -3\n").find("must be positive"), std::string::npos);
  EXPECT_NE(error_of("[train]\nprecision = \"fp8\"\n").find("bf16"), std::string::npos);
  EXPECT_NE(error_of("[model]\npreset = \"gpt5\"\n").find("gpt2-124m"), std::string::npos);
  EXPECT_NE(error_of("[model]\nnorm = \"batchnorm\"\n").find("layernorm, rmsnorm"),
            std::string::npos);
  EXPECT_NE(error_of("[train\nsteps = 3\n").find("malformed TOML"), std::string::npos);
  EXPECT_NE(error_of("[batch]\nseq_len = 1000\n").find("model.seq_len"), std::string::npos);
  EXPECT_NE(error_of("", {"nonsense"}).find("section.key=value"), std::string::npos);
  EXPECT_NE(error_of("[optim]\nlr = nan\n").find("'optim.lr' = nan must be a finite number"),
            std::string::npos)
      << error_of("[optim]\nlr = nan\n");
  EXPECT_NE(error_of("[optim]\ngrad_clip = inf\n").find("finite"), std::string::npos);
}

TEST(TrainConfig, ElasticSectionIsReadAndItsTimeoutsCheckedInOrder) {
  const TrainConfig defaults = parse_train_config("", "test.toml");
  EXPECT_EQ(defaults.elastic.heartbeat_interval_s, 0.1);
  EXPECT_EQ(defaults.elastic.progress_timeout_s, 2.0);
  EXPECT_EQ(defaults.elastic.straggler_factor, 1.5);
  EXPECT_NO_THROW(defaults.check_timeout_ladder());
  const TrainConfig c = parse_train_config(
      "[elastic]\nheartbeat_interval_s = 0.2\nheartbeat_timeout_s = 2\nprogress_timeout_s = 4\n"
      "snapshot_every = 5\nstraggler_factor = 0\n",
      "test.toml");
  EXPECT_EQ(c.elastic.heartbeat_interval_s, 0.2);
  EXPECT_EQ(c.elastic.heartbeat_timeout_s, 2.0);
  EXPECT_EQ(c.elastic.progress_timeout_s, 4.0);
  EXPECT_EQ(c.elastic.snapshot_every, 5);
  EXPECT_EQ(c.elastic.straggler_factor, 0.0);  // off
  EXPECT_NE(error_of("[elastic]\nstraggler_factor = 0.5\n").find("a factor above 1"),
            std::string::npos);
  auto ladder_error = [](const std::string& toml) {
    try {
      parse_train_config(toml, "test.toml").check_timeout_ladder();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(ladder_error("[elastic]\nheartbeat_interval_s = 1\nheartbeat_timeout_s = 1\n")
                .find("must be below elastic.heartbeat_timeout_s"),
            std::string::npos);
  EXPECT_NE(ladder_error("[elastic]\nheartbeat_timeout_s = 3\nprogress_timeout_s = 2\n")
                .find("must not exceed elastic.progress_timeout_s"),
            std::string::npos);
  // Under gloo the agent decides before any rank's collective deadline passes.
  EXPECT_FALSE(ladder_error("[parallel]\ntransport = \"gloo\"\ntimeout_s = 2\n").empty());
  EXPECT_TRUE(ladder_error("[parallel]\ntransport = \"gloo\"\ntimeout_s = 3\n").empty());
}

TEST(TrainConfig, ParallelSectionIsReadAndOverriddenLikeAnyOther) {
  const TrainConfig defaults = parse_train_config("", "test.toml");
  EXPECT_EQ(defaults.parallel.dp, 1);
  EXPECT_EQ(defaults.parallel.tp, 1);
  EXPECT_FALSE(defaults.parallel.sequence_parallel);
  EXPECT_EQ(defaults.parallel.zero, 0);
  EXPECT_DOUBLE_EQ(defaults.parallel.bucket_mb, 1.0);
  EXPECT_EQ(defaults.parallel.transport, TransportKind::kThreads);
  EXPECT_FALSE(defaults.parallel.check_replicas);

  const std::string toml = R"(
[parallel]
dp = 2
tp = 4
sp = true
zero = 1
bucket_mb = 0.25
transport = "mpi"
check_replicas = true
)";
  TrainConfig c = parse_train_config(toml, "test.toml");
  EXPECT_EQ(c.parallel.dp, 2);
  EXPECT_EQ(c.parallel.tp, 4);
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.parallel.zero, 1);
  EXPECT_DOUBLE_EQ(c.parallel.bucket_mb, 0.25);
  EXPECT_EQ(c.parallel.transport, TransportKind::kMpi);
  EXPECT_TRUE(c.parallel.check_replicas);
  EXPECT_EQ(c.parallel.world_size(), 8);

  // --set overrides the file, in order; a bare word is a string and an integer is a size.
  c = parse_train_config(
      toml, "test.toml",
      {"parallel.tp=2", "parallel.transport=threads", "parallel.sp=false", "parallel.bucket_mb=2",
       "parallel.zero=0", "parallel.tp=1", "parallel.dp=3", "parallel.check_replicas=false"});
  EXPECT_EQ(c.parallel.dp, 3);
  EXPECT_EQ(c.parallel.tp, 1);
  EXPECT_FALSE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.parallel.zero, 0);
  EXPECT_DOUBLE_EQ(c.parallel.bucket_mb, 2.0);
  EXPECT_EQ(c.parallel.transport, TransportKind::kThreads);
  EXPECT_FALSE(c.parallel.check_replicas);
}

// Keys that name a choice are parsed once, into the enums the runtime takes.
TEST(TrainConfig, ChoicesAreParsedIntoTheirTypes) {
  const TrainConfig c = parse_train_config(R"(
[data]
mode = "shuffled"
tokenizer = "byte"
[parallel]
pp = 2
schedule = "zb-h1"
recompute = "selective"
transport = "gloo"
)",
                                           "test.toml");
  EXPECT_EQ(c.data_mode, SamplingMode::kShuffled);
  EXPECT_EQ(c.parallel.schedule, ScheduleKind::kZeroBubbleH1);
  EXPECT_EQ(c.parallel.recompute, Recompute::kSelective);
  EXPECT_EQ(c.parallel.transport, TransportKind::kGloo);
  const TrainConfig defaults;
  EXPECT_EQ(defaults.parallel.schedule, ScheduleKind::kOneFOneB);
  EXPECT_EQ(defaults.parallel.recompute, Recompute::kNone);
  EXPECT_EQ(defaults.data_mode, SamplingMode::kSequential);
  EXPECT_THROW(parse_train_config("[data]\ntokenizer = \"bpe9\"\n", "t.toml"), ConfigError);
  EXPECT_THROW(parse_train_config("[parallel]\nschedule = \"1f2b\"\n", "t.toml"), ConfigError);
}

// train.gemm_library names the library of every matmul; one this build lacks is refused with
// the key and the fix.
TEST(TrainConfig, GemmLibraryIsOneThisBuildHas) {
  EXPECT_EQ(TrainConfig{}.gemm_library, GemmLibrary::kOneDnn);
  EXPECT_EQ(parse_train_config("[train]\ngemm_library = \"onednn\"\n", "t.toml").gemm_library,
            GemmLibrary::kOneDnn);
  try {
    parse_train_config("[train]\ngemm_library = \"cublas\"\n", "t.toml");
    ADD_FAILURE() << "an unknown GEMM library was accepted";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("train.gemm_library"), std::string::npos) << message;
    EXPECT_NE(message.find("onednn, mkl"), std::string::npos) << message;
  }
#if defined(LATTICE_HAVE_MKL)
  EXPECT_EQ(parse_train_config("[train]\ngemm_library = \"mkl\"\n", "t.toml").gemm_library,
            GemmLibrary::kMkl);
#else
  EXPECT_THROW(parse_train_config("[train]\ngemm_library = \"mkl\"\n", "t.toml"), ConfigError);
#endif
}

TEST(TrainConfig, LayersPerChunkIsAListOfLayerCounts) {
  const TrainConfig c =
      parse_train_config("[parallel]\npp = 2\nlayers_per_chunk = [1, 3]\n", "test.toml");
  EXPECT_EQ(c.parallel.layers_per_chunk, (std::vector<int>{1, 3}));
  const TrainConfig o = parse_train_config("", "test.toml", {"parallel.layers_per_chunk=[2, 2]"});
  EXPECT_EQ(o.parallel.layers_per_chunk, (std::vector<int>{2, 2}));
  std::string e = error_of("[parallel]\nlayers_per_chunk = 3\n");
  EXPECT_NE(e.find("must be a list of layer counts"), std::string::npos) << e;
  e = error_of("[parallel]\nlayers_per_chunk = [1, 0]\n");
  EXPECT_NE(e.find("must be positive"), std::string::npos) << e;
}

TEST(TrainConfig, BadParallelValuesNameTheKeyAndTheFix) {
  std::string e = error_of("[parallel]\nzero = 4\n");
  EXPECT_NE(e.find("'parallel.zero' = 4"), std::string::npos) << e;
  EXPECT_NE(e.find("use 0 (replicated), 1 (optimizer state sharded over dp), 2"), std::string::npos)
      << e;
  EXPECT_NE(error_of("", {"parallel.zero=-1"}).find("'parallel.zero' = -1"), std::string::npos);
  e = error_of("[parallel]\ndp = 0\n");
  EXPECT_NE(e.find("'parallel.dp' = 0 must be a number of ranks from 1"), std::string::npos) << e;
  EXPECT_NE(e.find("HINT: use 1"), std::string::npos) << e;
  e = error_of("", {"parallel.tp=-2"});
  EXPECT_NE(e.find("'parallel.tp' = -2"), std::string::npos) << e;
  e = error_of("[parallel]\ndp = 1.5\n");
  EXPECT_NE(e.find("'parallel.dp' = 1.5 must be an integer"), std::string::npos) << e;
  e = error_of("[parallel]\ntransport = \"nccl\"\n");
  EXPECT_NE(e.find("'parallel.transport' = \"nccl\""), std::string::npos) << e;
  EXPECT_NE(e.find("HINT: use threads, mpi or gloo"), std::string::npos) << e;
  e = error_of("[parallel]\nbucket_mb = 0\n");
  EXPECT_NE(e.find("'parallel.bucket_mb' = 0 must be a positive size in MB"), std::string::npos)
      << e;
  EXPECT_NE(error_of("[parallel]\nbucket_mb = nan\n")
                .find("'parallel.bucket_mb' = nan must be a finite number"),
            std::string::npos);
  e = error_of("[parallel]\nsp = \"yes\"\n");
  EXPECT_NE(e.find("'parallel.sp' = \"yes\" must be true or false"), std::string::npos) << e;
  // Misspellings and other frameworks' names point at the key.
  e = error_of("[parallel]\nzero_stage = 1\n");
  EXPECT_NE(e.find("did you mean 'parallel.zero'"), std::string::npos) << e;
  e = error_of("[parallel]\ntensor_model_parallel_size = 2\n");
  EXPECT_NE(e.find("did you mean 'parallel.tp'"), std::string::npos) << e;
  e = error_of("", {"parallel.bucket_size=2"});
  EXPECT_NE(e.find("did you mean 'parallel.bucket_mb'"), std::string::npos) << e;
  e = error_of("[parallel]\ncheck_replica = true\n");
  EXPECT_NE(e.find("did you mean 'parallel.check_replicas'"), std::string::npos) << e;
}

TEST(TrainConfig, GlobalBatchIsDerivedOrRejectedWithTheFormula) {
  TrainConfig c;
  c.micro_batch = 4;
  c.global_batch = 32;
  c.resolve_batch(2);
  EXPECT_EQ(c.micro_batches, 4);

  c = TrainConfig();
  c.micro_batches = 2;
  c.global_batch = 16;
  c.resolve_batch(2);
  EXPECT_EQ(c.micro_batch, 4);

  c = TrainConfig();
  c.micro_batch = 4;
  c.micro_batches = 2;
  c.global_batch = 12;
  try {
    c.resolve_batch(1);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("global_batch = micro_batch × micro_batches × dp"),
              std::string::npos)
        << e.what();
  }

  c = TrainConfig();
  c.micro_batch = 3;
  c.global_batch = 16;
  EXPECT_THROW(c.resolve_batch(1), ConfigError);  // 16 is not a multiple of 3

  c = TrainConfig();
  c.global_batch = 16;
  EXPECT_THROW(c.resolve_batch(1), ConfigError);  // one number is not enough
}

TEST(TrainConfig, RefitToASmallerWorldKeepsTheGlobalBatch) {
  TrainConfig c = parse_train_config("[batch]\nmicro_batch = 3\n[parallel]\ndp = 4\n", "test.toml");
  TrainConfig three = c;
  three.refit_to_world(3);
  EXPECT_EQ(three.parallel.dp, 3);
  EXPECT_EQ(three.global_batch, 12);
  EXPECT_EQ(three.micro_batch, 2);  // 4 rows per rank: the largest micro-batch up to 3 dividing 4
  EXPECT_EQ(three.micro_batches, 2);
  TrainConfig two = c;
  two.refit_to_world(2);
  EXPECT_EQ(two.parallel.dp, 2);
  EXPECT_EQ(two.micro_batch, 3);
  EXPECT_EQ(two.micro_batches, 2);
  EXPECT_NO_THROW(two.resolve_batch(two.parallel.dp));  // consistent as it stands
}

TEST(TrainConfig, RefitThatCannotKeepTheBatchNamesTheWorldSizesThatWould) {
  TrainConfig c = parse_train_config("[batch]\nmicro_batch = 2\n[parallel]\ndp = 2\ntp = 2\n",
                                     "test.toml");  // G = 4
  try {
    c.refit_to_world(3);
    ADD_FAILURE() << "a world of 3 was accepted for tp 2";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("tp × cp × pp = 2 × 1 × 1 must divide the world"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("world sizes that keep it: 2, 4"), std::string::npos)
        << e.what();
  }
}

TEST(TrainConfig, TheRefittableWorldsAreTheModelGroupTimesEachDpDividingTheGlobalBatch) {
  // tp 2 × pp 2 × dp 3, global batch 12: dp 1, 2, 3 divide it (dp 3 is the layout's own).
  TrainConfig c = parse_train_config(
      "[batch]\nmicro_batch = 4\n[parallel]\ndp = 3\ntp = 2\npp = 2\n", "test.toml");
  EXPECT_EQ(c.refittable_worlds(), (std::vector<int>{4, 8, 12}));
  // Global batch 10 on dp 5: dp 3 and 4 do not divide it.
  c = parse_train_config("[batch]\nmicro_batch = 2\n[parallel]\ndp = 5\n", "test.toml");
  EXPECT_EQ(c.refittable_worlds(), (std::vector<int>{1, 2, 5}));
  for (int world : c.refittable_worlds()) {
    TrainConfig refit = c;
    EXPECT_NO_THROW(refit.refit_to_world(world)) << world;
  }
  EXPECT_THROW(c.refit_to_world(3), ConfigError);
}

}  // namespace
}  // namespace lattice
